"""Run untrusted Python (model-written code and its tests) in a confined, time- and memory-limited child.

What is enforced, and by what. "Kernel" means the OS enforces it whatever the code does; "hook" means a
Python audit hook (PEP 578) installed before the program's first line, which cannot be removed from
Python but which native code could bypass (so loading native code is itself refused). The layers a run
actually had are listed in `RunResult.enforced`; kernel layers are probed, not assumed.

- runs forever: kernel. At `timeout_s` of wall clock the whole process group gets SIGKILL (a sleeping
  loop too); RLIMIT_CPU backs it up for busy loops.
- memory: kernel. RLIMIT_AS = `memory_mb`; a larger allocation raises MemoryError.
- fork bomb: hook refuses fork/exec/spawn/subprocess/os.system (and the _posixsubprocess module that
  forks without an audit event); kernel: RLIMIT_NPROC = `max_processes` binds for a non-root user only
  (Linux exempts uid 0, even in a user namespace), and the process-group kill at the deadline ends
  whatever was started in the group.
- big files / output: kernel. RLIMIT_FSIZE = `max_file_mb` per file, stdout and stderr included (they
  go to files, of which the result keeps the tail).
- writes outside its folder: kernel with Landlock (writes, creates, removes only beneath the fresh work
  dir, plus /dev/null); hook always (open-for-write, rename, remove, mkdir, chmod... outside refused).
  Without Landlock the guarantee is the hook's: Python-level.
- reading secrets: the environment is built fresh (PATH, HOME, TMPDIR, LANG, PYTHONHASHSEED: no tokens,
  no proxies); kernel with Landlock: reads only from the stdlib, system libraries, time zones and the
  work dir, and /proc/<other pid> is closed (also in the user namespace); hook refuses /proc of others.
- network: kernel with a network namespace (`unshare --user --net`: only a down loopback, so even
  127.0.0.1 is unreachable) and with Landlock ABI >= 4 (no TCP connect/bind); hook refuses sockets/DNS.
- signals: kernel with Landlock ABI >= 6 (no signals to processes outside); hook refuses os.kill.
The work dir is a new temporary folder, the child's cwd, HOME and TMPDIR, deleted after every run.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

CHILD = Path(__file__).with_name("sandbox_child.py")
ALL_LAYERS = ("netns", "landlock", "audit")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock for the whole run, interpreter start included
    memory_mb: int = 1024  # RLIMIT_AS: address space, not resident memory
    max_processes: int = 16  # RLIMIT_NPROC (threads count too)
    max_file_mb: int = 16  # RLIMIT_FSIZE: any one file, stdout/stderr included
    max_output_chars: int = 20_000  # of stdout / stderr kept in the result (the tail)
    layers: tuple[str, ...] = ALL_LAYERS  # confinement layers to attempt; tests switch them one by one

    def __post_init__(self) -> None:
        unknown = sorted(set(self.layers) - set(ALL_LAYERS))
        if unknown:
            raise ValueError(f"sandbox layers {unknown}: unknown; allowed: {', '.join(ALL_LAYERS)}")
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.max_processes <= 0 or self.max_file_mb <= 0:
            raise ValueError(f"sandbox limits must be positive: {self}")


@dataclass(frozen=True)
class RunResult:
    status: str  # "ok" (exit 0) | "error" (exception / non-zero exit) | "timeout" | "killed" (signal)
    returncode: int | None
    error: str  # the exception line of the traceback, the signal, or "" when ok
    stdout: str
    stderr: str
    wall_s: float
    enforced: tuple[str, ...] = field(default=())  # layers that were active, e.g. ("netns", "landlock-fs", ...)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---------------------------------------------------------------------------------------------
# environment


@functools.cache
def netns_prefix() -> tuple[str, ...]:
    """`unshare --user --net --` when unprivileged user + network namespaces work here, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run([exe, "--user", "--net", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (exe, "--user", "--net", "--") if probe.returncode == 0 else ()


def child_env(workdir: str) -> dict[str, str]:
    """A fresh environment, not a filtered copy: nothing of the caller's (tokens, proxies, paths) leaks."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0"}


def _config(root: Path, limits: Limits, report_fd: int) -> Path:
    cfg = {"workdir": str(root / "work"), "program": str(root / "work" / "program.py"),
           "cpu_s": math.ceil(limits.timeout_s), "memory_mb": limits.memory_mb,
           "max_processes": limits.max_processes, "max_file_mb": limits.max_file_mb,
           "layers": list(limits.layers), "report_fd": report_fd}
    path = root / "io" / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# ---------------------------------------------------------------------------------------------
# running


def _classify(rc: int | None, timed_out: bool, stderr: str) -> tuple[str, str]:
    if timed_out:
        return "timeout", "wall-clock limit"
    if rc == 0:
        return "ok", ""
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc)
        # RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL at the hard one.
        return ("timeout" if sig == signal.SIGXCPU else "killed"), sig.name
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return "error", (lines[-1].strip() if lines else f"exit code {rc}")


def _tail(path: Path, limit: int) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - limit * 4))
        return f.read().decode("utf-8", "replace")[-limit:]


def _spawn(root: Path, limits: Limits) -> tuple[int | None, bool, tuple[str, ...], float]:
    read_fd, write_fd = os.pipe()
    prefix = netns_prefix() if "netns" in limits.layers else ()
    cmd = [*prefix, sys.executable, "-I", "-S", "-B", str(CHILD), str(_config(root, limits, write_fd))]
    start = time.perf_counter()
    with open(root / "io" / "stdout", "wb") as out, open(root / "io" / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=root / "work", env=child_env(str(root / "work")), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)  # also reaps anything the program left running in its session
        proc.wait()
    wall = time.perf_counter() - start
    with os.fdopen(read_fd, "rb") as f:
        report = f.read(4096)
    layers = tuple(json.loads(report)) if report else ()
    return proc.returncode, timed_out, (("netns",) if prefix else ()) + layers, wall


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(source: str, limits: Limits = Limits()) -> RunResult:
    """Run `source` as a program in a fresh sandbox; never raises for anything the program does."""
    root = Path(tempfile.mkdtemp(prefix="scalelab-sandbox-"))
    try:
        (root / "work").mkdir()
        (root / "io").mkdir()
        (root / "work" / "program.py").write_text(source)
        rc, timed_out, enforced, wall = _spawn(root, limits)
        stdout = _tail(root / "io" / "stdout", limits.max_output_chars)
        stderr = _tail(root / "io" / "stderr", limits.max_output_chars)
    finally:
        _remove_tree(root)
    status, error = _classify(rc, timed_out, stderr)
    return RunResult(status, rc, error, stdout, stderr, wall, enforced)


def _remove_tree(root: Path) -> None:
    def make_writable_and_retry(func, path, _exc):
        # The program may leave read-only files or folders behind; deletion needs write permission.
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        func(path)

    shutil.rmtree(root, onerror=make_writable_and_retry)


def run_many(sources: Sequence[str], limits: Limits = Limits(), workers: int = 2) -> list[RunResult]:
    """`run_python` over many programs, `workers` at a time (each child is its own process)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda s: run_python(s, limits), sources))


@functools.cache
def available_layers() -> tuple[str, ...]:
    """The layers a default sandbox gets on this host (one trivial run)."""
    return run_python("pass", Limits(timeout_s=30)).enforced
