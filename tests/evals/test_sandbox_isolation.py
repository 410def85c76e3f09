"""The sandbox's OS isolation as root: the child gives up uid 0 (so the process limit binds), model-written code
is refused where no OS layer holds unless a flag allows it, and the layers a run had are recorded."""
from __future__ import annotations

import errno
import os

import pytest

from scalelab.evals import sandbox
from scalelab.evals.codetasks import HumanEval, run_tests, sandbox_record
from scalelab.evals.sandbox import (OS_LAYERS, Limits, SandboxInfo, SandboxUnavailable, available_layers, describe,
                                    run_python)
from tests.evals.test_sandbox import FAST, connect_program, local_server, sandbox_processes_after  # noqa: F401

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is for a root caller")


def need_uid_drop() -> None:
    if "uid-drop" not in available_layers():
        pytest.skip(f"no interpreter this uid can run here (available: {available_layers()})")


# forks children that sleep (so they stay counted) until the kernel says no, at most `cap`
FORKS = ("import os, time\nn = 0\ntry:\n    while n < {cap}:\n        if os.fork() == 0:\n"
         "            time.sleep(2)\n            os._exit(0)\n        n += 1\n    print(n, 0)\n"
         "except OSError as e:\n    print(n, e.errno)\n")


@as_root
def test_a_root_caller_runs_the_child_as_an_unprivileged_uid():
    need_uid_drop()
    # without the user namespace getuid is the real uid, not a namespace's mapping of it
    r = run_python("import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())",
                   Limits(timeout_s=5, layers=("uid", "audit")))
    assert r.ok, r.stderr
    assert r.stdout.split("\n")[0] == f"{sandbox.SANDBOX_UID} {sandbox.SANDBOX_UID} {sandbox.SANDBOX_UID} []"
    assert "uid-drop" in r.enforced
    default = run_python("import os\nprint(os.getuid())", FAST)
    assert default.ok and int(default.stdout) != 0 and "uid-drop" in default.enforced


@as_root
def test_the_process_limit_binds_once_the_uid_is_dropped():
    need_uid_drop()
    limited = run_python(FORKS.format(cap=40), Limits(timeout_s=5, max_processes=8, layers=("uid",)))
    n, err = map(int, limited.stdout.split())
    assert err == errno.EAGAIN and n < 8  # the child itself is one of the 8
    # the same program as root (no uid drop): Linux exempts uid 0 from RLIMIT_NPROC, all 40 forks succeed
    exempt = run_python(FORKS.format(cap=40), Limits(timeout_s=5, max_processes=8, layers=("netns",)))
    assert exempt.stdout.split() == ["40", "0"]
    assert sandbox_processes_after() == 0


def test_the_network_is_unreachable_with_the_uid_dropped(local_server):  # noqa: F811
    port, accepted = local_server
    r = run_python(connect_program("127.0.0.1", port), FAST)
    assert r.status == "error" and "connected" not in r.stdout and not accepted
    assert set(r.enforced) & set(OS_LAYERS)


def writes_marker(path) -> str:
    return f"open({str(path)!r}, 'w').write('ran')\n"


def test_no_os_isolation_refuses_to_run_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "available_layers", lambda: ("rlimits", "audit-hook"))  # the probe finds none
    marker = tmp_path / "marker"
    with pytest.raises(SandboxUnavailable, match="no OS isolation here .*allow_weak_sandbox"):
        run_python(writes_marker(marker), Limits(timeout_s=5, layers=()))
    assert not marker.exists()
    # the flag overrides: with no layer at all (no hook either) the program really runs and writes outside
    r = run_python(writes_marker(marker), Limits(timeout_s=5, layers=(), allow_weak_sandbox=True))
    assert r.ok and marker.read_text() == "ran" and r.enforced == ("rlimits",)


def test_the_child_refuses_when_the_probe_was_wrong(monkeypatch, tmp_path):
    # the probe claims a network namespace, but no layer is asked for: the child stops before the program
    monkeypatch.setattr(sandbox, "describe", lambda limits: SandboxInfo(("netns",)))
    marker = tmp_path / "marker"
    with pytest.raises(SandboxUnavailable, match="layers rlimits;"):
        run_python(writes_marker(marker), Limits(timeout_s=5, layers=()))
    assert not marker.exists()


def test_the_active_layers_are_recorded():
    info = describe(Limits(layers=("audit", "uid")))
    assert set(info.layers) <= {"uid-drop", "rlimits", "audit-hook"} and "audit-hook" in info.layers
    assert info.os_isolated == ("uid-drop" in info.layers)
    assert describe().layers == available_layers()
    passed, r = run_tests("assert 1 + 1 == 2", FAST)
    assert passed
    assert describe().layers == r.enforced
    record = sandbox_record(HumanEval())
    assert record == {"layers": list(r.enforced), "os_isolated": True, "weak_allowed": False}
    assert HumanEval(allow_weak_sandbox=True).limits().allow_weak_sandbox


def test_a_code_score_names_its_sandbox_layers(monkeypatch):
    from scalelab.evals.codetasks import verdict
    passed, r = run_tests("assert sorted([3, 1]) == [1, 3]", FAST)
    assert verdict(passed, r).endswith(f"[sandbox: {'+'.join(r.enforced)}]")
