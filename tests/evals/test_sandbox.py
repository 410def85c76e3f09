"""The sandbox against adversarial programs, layer by layer, plus real HumanEval solutions.

Each threat is tested with the default sandbox (whatever layers this host has) and, where a kernel layer
exists here, with that layer alone, so a regression in one layer is not hidden by another.
"""
from __future__ import annotations

import ast
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from scalelab.evals.codetasks import run_tests, verdict
from scalelab.evals.sandbox import Limits, available_layers, child_env, run_many, run_python, starved
from scalelab.evals.tasks import get_task

FAST = Limits(timeout_s=1.5)


def only(*layers: str) -> Limits:
    # one layer alone may be no OS isolation (the hook): these runs test that layer, so they allow it
    return Limits(timeout_s=1.5, layers=layers, allow_weak_sandbox=True)


def need(layer: str) -> None:
    if layer not in available_layers():
        pytest.skip(f"this host has no {layer} (available: {available_layers()})")


def sandbox_processes() -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += b"sandbox_child.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return count


def sandbox_processes_after(wait_s: float = 5.0) -> int:
    """Survivors once the kernel has had time to reap a killed group (a loaded CPU can take well over 0.2 s)."""
    deadline = time.monotonic() + wait_s
    while (n := sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def test_plain_program_runs_with_its_output_and_the_always_on_layers():
    r = run_python("import math\nprint(math.factorial(10))", FAST)
    assert r.ok and r.status == "ok" and r.returncode == 0
    assert r.stdout.strip() == "3628800"
    assert {"rlimits", "audit-hook"} <= set(r.enforced)


def test_exceptions_are_errors_with_the_exception_line():
    r = run_python("assert 1 + 1 == 3, 'arithmetic'", FAST)
    assert r.status == "error" and r.returncode == 1
    assert r.error == "AssertionError: arithmetic"


def test_unknown_layer_is_refused():
    with pytest.raises(ValueError, match="unknown"):
        Limits(layers=("seccomp",))


# ---------------------------------------------------------------------------------------------
# time


@pytest.mark.parametrize("program", ["while True: pass", "import time\nwhile True: time.sleep(0.1)"],
                         ids=["busy", "sleeping"])
def test_infinite_loops_are_killed_at_the_wall_clock(program):
    start = time.perf_counter()
    r = run_python(program, Limits(timeout_s=1.0))
    assert r.status == "timeout" and not r.ok
    assert 0.9 < r.wall_s < 3.0 and time.perf_counter() - start < 7.0  # a starved run is rerun once
    assert sandbox_processes() == 0


def test_cpu_time_is_measured_for_busy_and_sleeping_programs():
    busy = run_python("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass", FAST)
    sleeping = run_python("import time\ntime.sleep(0.4)", FAST)
    assert busy.ok and sleeping.ok and busy.reruns == sleeping.reruns == 0
    assert 0.4 <= busy.cpu_s <= busy.wall_s + 0.05
    assert sleeping.wall_s >= 0.4 and sleeping.cpu_s < busy.cpu_s - 0.3


@pytest.mark.parametrize("status,error,cpu_s,expected", [
    ("timeout", "wall-clock limit", 0.49, True),  # under half of the 1 s limit on the CPU: starved
    ("timeout", "wall-clock limit", 0.5, False),  # half or more: the program itself was slow
    ("timeout", "SIGXCPU", 0.1, False),  # the CPU limit, not the wall clock
    ("error", "ZeroDivisionError", 0.0, False),
    ("timeout", "wall-clock limit", None, False),  # not measured
])
def test_starved_means_a_wall_clock_timeout_with_little_cpu(status, error, cpu_s, expected):
    assert starved(status, error, cpu_s, timeout_s=1.0) is expected


def test_a_starved_run_is_rerun_once_and_says_so():
    sleeper = "import time\ntime.sleep(5)"
    once = run_python(sleeper, Limits(timeout_s=0.5, rerun_starved=False))
    twice = run_python(sleeper, Limits(timeout_s=0.5))
    assert once.status == twice.status == "timeout" and once.cpu_s < 0.25
    assert (once.reruns, twice.reruns) == (0, 1)
    assert "rerun after a starved first run" in verdict(False, twice)
    assert "rerun" not in verdict(False, once)


# ---------------------------------------------------------------------------------------------
# processes


FORK_BOMB = "import os\nwhile True:\n    os.fork()\n"


def test_fork_bomb_is_refused_and_leaves_nothing_running():
    r = run_python(FORK_BOMB, FAST)
    assert r.status == "error" and "os.fork is not allowed" in r.error
    assert sandbox_processes() == 0


def test_fork_bomb_under_kernel_limits_alone_is_contained():
    # Without the audit hook the bomb does fork (RLIMIT_NPROC caps it only for non-root users); the
    # process-group kill at the deadline ends it. The claim tested: it stops, and nothing survives.
    need("netns")
    r = run_python(FORK_BOMB, only("netns"))
    assert not r.ok and r.status in ("timeout", "error", "killed")
    assert sandbox_processes_after() == 0


@pytest.mark.parametrize("program", ["import subprocess\nsubprocess.run(['echo', 'hi'])",
                                     "import _posixsubprocess",  # forks without an audit event
                                     "import os\nos.system('echo hi')",
                                     "import os\nos.execv('/bin/echo', ['echo', 'hi'])"])
def test_spawning_commands_is_refused(program):
    r = run_python(program, FAST)
    assert r.status == "error" and "not allowed" in r.error and "hi" not in r.stdout


# ---------------------------------------------------------------------------------------------
# files


def write_to(path: Path) -> str:
    return f"open({str(path)!r}, 'w').write('escaped')\n"


def test_writing_outside_the_work_dir_fails_and_creates_nothing(tmp_path):
    target = tmp_path / "outside.txt"
    r = run_python(write_to(target), FAST)
    assert r.status == "error" and "PermissionError" in r.error
    assert not target.exists()


@pytest.mark.parametrize("layer", ["landlock", "audit"])
def test_each_layer_alone_confines_writes(tmp_path, layer):
    if layer == "landlock":
        need("landlock-fs")
    target = tmp_path / f"outside-{layer}.txt"
    program = (f"import os\nfd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)\n"
               if layer == "landlock" else write_to(target))
    r = run_python(program, only(layer))
    assert r.status == "error" and "PermissionError" in r.error
    assert not target.exists()


def test_writing_inside_the_work_dir_works_and_the_dir_is_removed_after():
    program = ("import os\nopen('notes.txt', 'w').write('kept')\nos.mkdir('sub')\n"
               "open('sub/x', 'w').write('y')\nos.chmod('sub', 0o500)\n"  # a read-only folder must still go
               "print(os.getcwd())\nprint(open('notes.txt').read())")
    r = run_python(program, FAST)
    assert r.ok, r.stderr
    workdir, content = r.stdout.split()
    assert content == "kept"
    assert not Path(workdir).exists()


def test_reading_files_outside_is_denied_by_landlock(tmp_path):
    need("landlock-fs")
    secret = tmp_path / "token.txt"
    secret.write_text("s3cr3t-file")
    r = run_python(f"print(open({str(secret)!r}).read())", FAST)
    assert r.status == "error" and "Permission denied" in r.error
    assert "s3cr3t-file" not in r.stdout


def test_huge_output_is_capped_by_the_file_size_limit():
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                   Limits(timeout_s=5, max_file_mb=1, max_output_chars=1000))
    assert not r.ok and r.status == "error"  # EFBIG once the 1 MiB stdout file is full
    assert len(r.stdout) <= 1000 and r.wall_s < 5


# ---------------------------------------------------------------------------------------------
# network


@pytest.fixture
def local_server():
    """A real listener on 127.0.0.1, so the sandboxed connect fails for the sandbox's reasons only."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.close()


def connect_program(host: str, port: int) -> str:
    return (f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(({host!r}, {port}))\n"
            "print('connected')\n")


def test_the_local_server_is_reachable_without_a_sandbox(local_server):
    port, accepted = local_server
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    time.sleep(0.1)
    assert accepted


@pytest.mark.parametrize("host", ["127.0.0.1", "1.1.1.1"])
def test_sockets_fail_in_the_default_sandbox(local_server, host):
    port, accepted = local_server
    r = run_python(connect_program(host, port if host == "127.0.0.1" else 80), FAST)
    assert r.status == "error" and "connected" not in r.stdout
    assert not accepted


@pytest.mark.parametrize("layer,needs,message", [("netns", "netns", "Network is unreachable"),
                                                 ("landlock", "landlock-tcp", "Permission denied"),
                                                 ("audit", "audit-hook", "socket.__new__ is not allowed")])
def test_each_layer_alone_blocks_tcp(local_server, layer, needs, message):
    need(needs)
    port, accepted = local_server
    r = run_python(connect_program("127.0.0.1", port), only(layer))
    assert r.status == "error" and message in r.error, r.error
    assert not accepted


def test_dns_lookups_are_refused():
    r = run_python("import socket\nprint(socket.gethostbyname('example.com'))", FAST)
    assert r.status == "error" and "example.com" not in r.stdout


# ---------------------------------------------------------------------------------------------
# memory, environment, signals, native code


def test_allocating_8_gb_fails_with_memory_error():
    r = run_python("x = bytearray(8 * 1024 ** 3)\nprint('allocated')", Limits(timeout_s=5, memory_mb=512))
    assert not r.ok and "allocated" not in r.stdout
    assert r.error == "MemoryError" or r.status == "killed"


def test_the_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("SCALELAB_FAKE_API_KEY", "s3cr3t-env")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    program = ("import os\nprint(sorted(os.environ))\nprint(os.environ.get('SCALELAB_FAKE_API_KEY'))\n"
               "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n")
    r = run_python(program, FAST)
    assert "s3cr3t-env" not in r.stdout + r.stderr and "proxy.invalid" not in r.stdout + r.stderr
    keys = ast.literal_eval(r.stdout.splitlines()[0])
    assert set(keys) <= set(child_env("/x")) | {"LC_CTYPE"}
    assert r.stdout.splitlines()[1] == "None"
    assert r.status == "error" and "environ" in r.error  # the parent's /proc environ is closed too


def test_signalling_the_parent_is_refused():
    r = run_python("import os\nos.kill(os.getppid(), 0)", FAST)  # signal 0: a probe, harmless if it got through
    assert r.status == "error" and "not allowed" in r.error


@pytest.mark.parametrize("program", ["import ctypes\nctypes.CDLL(None)", "import ctypes"])
def test_ctypes_is_refused(program):
    r = run_python(program, FAST)
    assert r.status == "error" and "ctypes" in r.error


def test_writing_an_extension_module_is_refused():
    r = run_python("open('evil.so', 'wb').write(b'\\x7fELF')", FAST)
    assert r.status == "error" and "native code" in r.error


def test_run_many_keeps_the_order():
    results = run_many([f"print({i})" for i in range(5)], FAST, workers=2)
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3", "4"]


# ---------------------------------------------------------------------------------------------
# real HumanEval solutions


@pytest.fixture(scope="module")
def humaneval(shared_data):
    return get_task("humaneval").load("test", source=str(shared_data / "humaneval"), limit=5)


def test_canonical_humaneval_solutions_pass(humaneval):
    task = get_task("humaneval")
    for ex in humaneval:
        body_only = task.score(ex, ex.answer)  # the canonical solution continues the prompt
        whole = task.score(ex, f"Here you go:\n```python\n{ex.meta['prompt']}{ex.answer}```\nDone.")
        assert body_only.correct and whole.correct, (ex.id, body_only.reason, whole.reason)


def test_wrong_humaneval_solutions_fail(humaneval):
    task = get_task("humaneval")
    ex = humaneval[0]  # has_close_elements
    wrong = task.score(ex, "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert not wrong.correct and "AssertionError" in wrong.reason
    broken = task.score(ex, "```python\ndef has_close_elements(numbers, threshold)\n    return False\n```")
    assert not broken.correct and "SyntaxError" in broken.reason


@pytest.mark.parametrize("hack", ["import sys\nsys.exit(0)", "import os\nos._exit(0)"])
def test_exiting_early_with_status_zero_does_not_pass(humaneval, hack):
    ex = humaneval[0]
    score = get_task("humaneval").score(ex, f"```python\n{hack}\ndef has_close_elements(n, t):\n    return 1\n```")
    assert not score.correct and "before the tests finished" in score.reason


def test_run_tests_requires_the_end_marker():
    passed, result = run_tests("assert True", FAST)
    assert passed and result.ok
    passed, result = run_tests("raise SystemExit(0)", FAST)
    assert not passed and result.ok
