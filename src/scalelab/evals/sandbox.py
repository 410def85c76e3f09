"""Run untrusted Python (model-written code and its tests) in a confined, time- and memory-limited child.

What is enforced, and by what. "Kernel" means the OS enforces it whatever the code does; "hook" means a
Python audit hook (PEP 578) installed before the program's first line, which cannot be removed from
Python but which native code could bypass (so loading native code is itself refused). The layers a run
actually had are listed in `RunResult.enforced`; kernel layers are probed, not assumed.

- runs forever: kernel. At `timeout_s` of wall clock the whole process group gets SIGKILL (a sleeping
  loop too); RLIMIT_CPU backs it up for busy loops. A run cut at the wall clock after less than half as
  much CPU time was starved (a loaded host, or a program that sleeps), not slow: it runs once more, and
  only the second run's verdict counts, so a busy machine does not score correct code as a timeout.
- memory: kernel. RLIMIT_AS = `memory_mb`; a larger allocation raises MemoryError.
- fork bomb: hook refuses fork/exec/spawn/subprocess/os.system (and the _posixsubprocess module that
  forks without an audit event); kernel: RLIMIT_NPROC = `max_processes` binds for a non-root user only
  (Linux exempts uid 0, even in a user namespace), so a caller running as root starts the child as
  `nobody` (layer "uid-drop"; the limit then counts every process of that uid on the host); the
  process-group kill at the deadline ends whatever was started in the group.
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

Without any OS layer (no namespace, no Landlock, no uid drop) only the hook and the rlimits stand between
the program and the host, and a root caller's process limit does not bind: model-written code is then not
run at all (`SandboxUnavailable`) unless `Limits.allow_weak_sandbox` says so. `describe()` names the layers
a sandbox gets here, for callers to record beside their scores.
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from scalelab.core.errors import SandboxError

CHILD = Path(__file__).with_name("sandbox_child.py")
ALL_LAYERS = ("netns", "landlock", "audit", "uid")
OS_LAYERS = ("netns", "landlock-fs", "uid-drop")  # enforced by the kernel whatever the program does
SANDBOX_UID = 65534  # nobody / nogroup: owns nothing, so a dropped child can write only its work dir


class SandboxUnavailable(SandboxError, RuntimeError):
    """No OS isolation layer is available for model-written code, and weak sandboxes are not allowed."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock for the whole run, interpreter start included
    memory_mb: int = 1024  # RLIMIT_AS: address space, not resident memory
    max_processes: int = 16  # RLIMIT_NPROC (threads count too)
    max_file_mb: int = 16  # RLIMIT_FSIZE: any one file, stdout/stderr included
    max_output_chars: int = 20_000  # of stdout / stderr kept in the result (the tail)
    layers: tuple[str, ...] = ALL_LAYERS  # confinement layers to attempt; tests switch them one by one
    allow_weak_sandbox: bool = False  # run even with no OS layer (hook + rlimits only); off: refuse to run
    rerun_starved: bool = True  # a wall-clock timeout with CPU time < STARVED_CPU_SHARE of it runs once more

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
    cpu_s: float | None = None  # user + system CPU time of the program (None: not measured)
    reruns: int = 0  # 1 when a starved first run was discarded and this is the second

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---------------------------------------------------------------------------------------------
# environment


def _as_user(uid: int | None) -> dict:
    """Popen arguments that start the child as `uid` (groups dropped first, then gid, then uid)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


@functools.cache
def netns_prefix(uid: int | None = None) -> tuple[str, ...]:
    """`unshare --user --net --` when unprivileged user + network namespaces work here for `uid` (the
    child's), else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run([exe, "--user", "--net", "--", "true"], capture_output=True, timeout=10, cwd="/",
                               **_as_user(uid))
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (exe, "--user", "--net", "--") if probe.returncode == 0 else ()


@dataclass(frozen=True)
class UidDrop:
    uid: int
    python: str  # an interpreter of this Python version that `uid` may execute


def _interpreters() -> list[str]:
    """This interpreter, then the same version installed system-wide: a private install (e.g. under a 0700
    home) cannot be executed by another uid, and the child needs the stdlib only."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    found = [sys.executable, getattr(sys, "_base_executable", ""), system]
    return [p for p in dict.fromkeys(found) if p]


@functools.cache
def drop_uid() -> UidDrop | None:
    """How the child gives up root: the uid, and an interpreter it can run (same major.minor). None when this
    process is not root (the child already is unprivileged) or no interpreter works for that uid."""
    if os.geteuid() != 0:
        return None
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in _interpreters():
        try:
            probe = subprocess.run([python, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True, timeout=30, cwd="/", env=child_env("/"),
                                   **_as_user(SANDBOX_UID))
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0 and probe.stdout.strip() == want:
            return UidDrop(SANDBOX_UID, python)
    return None


def child_env(workdir: str) -> dict[str, str]:
    """A fresh environment, not a filtered copy: nothing of the caller's (tokens, proxies, paths) leaks."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0"}


def _config(root: Path, limits: Limits, report_fd: int, outer: tuple[str, ...]) -> Path:
    """`outer`: the OS layers the parent set up (netns, uid-drop); the child adds Landlock and checks that
    at least one OS layer holds before the program's first line (unless weak sandboxes are allowed)."""
    cfg = {"workdir": str(root / "work"), "program": str(root / "work" / "program.py"),
           "cpu_s": math.ceil(limits.timeout_s), "memory_mb": limits.memory_mb,
           "max_processes": limits.max_processes, "max_file_mb": limits.max_file_mb,
           "layers": list(limits.layers), "report_fd": report_fd, "outer_layers": list(outer),
           "os_layers": list(OS_LAYERS), "require_os_layer": not limits.allow_weak_sandbox}
    path = root / "io" / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _hand_over(root: Path, uid: int) -> None:
    """Let `uid` read its config and the child script and own only the work dir (and the program in it)."""
    for path in (root, root / "io"):
        path.chmod(0o711)  # traversable, not listable
    for path in (root / "io").iterdir():
        path.chmod(0o644)
    for path in (root / "work", root / "work" / "program.py"):
        os.chown(path, uid, uid)


# ---------------------------------------------------------------------------------------------
# running


# A run cut at the wall clock with less CPU time than this share of the limit never had the CPU the limit
# assumes: on 2 busy cores a correct program can be scheduled for well under half its wall time.
STARVED_CPU_SHARE = 0.5
WALL_CLOCK = "wall-clock limit"  # the error of a run killed at timeout_s (_classify)


def starved(status: str, error: str, cpu_s: float | None, timeout_s: float) -> bool:
    return (status == "timeout" and error == WALL_CLOCK and cpu_s is not None
            and cpu_s < STARVED_CPU_SHARE * timeout_s)


def _classify(rc: int | None, timed_out: bool, stderr: str) -> tuple[str, str]:
    if timed_out:
        return "timeout", WALL_CLOCK
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


def _wait(pid: int, timeout_s: float) -> tuple[int, bool, float]:
    """(return code, timed out, CPU seconds): waits with wait4, which returns the child's resource usage
    (its reaped descendants included), killing the process group at the deadline."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        timed_out = not done and time.monotonic() >= deadline
        if timed_out:
            _kill_group(pid)
            done, status, usage = os.wait4(pid, 0)
        if done:
            return os.waitstatus_to_exitcode(status), timed_out, usage.ru_utime + usage.ru_stime
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, 0.05)


def _spawn(root: Path, limits: Limits) -> tuple[int | None, bool, tuple[str, ...], float, float]:
    read_fd, write_fd = os.pipe()
    drop = drop_uid() if "uid" in limits.layers else None
    uid = drop.uid if drop else None
    prefix = netns_prefix(uid) if "netns" in limits.layers else ()
    outer = (("netns",) if prefix else ()) + (("uid-drop",) if drop else ())
    child = root / "io" / CHILD.name  # a copy: the source tree may not be readable by the dropped uid
    shutil.copyfile(CHILD, child)
    python = drop.python if drop else sys.executable
    cmd = [*prefix, python, "-I", "-S", "-B", str(child), str(_config(root, limits, write_fd, outer))]
    if drop:
        _hand_over(root, drop.uid)
    start = time.perf_counter()
    with open(root / "io" / "stdout", "wb") as out, open(root / "io" / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=root / "work", env=child_env(str(root / "work")), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, pass_fds=(write_fd,), start_new_session=True,
                                **_as_user(uid))
    os.close(write_fd)
    try:
        proc.returncode, timed_out, cpu_s = _wait(proc.pid, limits.timeout_s)
    finally:
        _kill_group(proc.pid)  # also ends anything the program left running in its session
        if proc.returncode is None:  # interrupted while waiting
            proc.wait()
    wall = time.perf_counter() - start
    with os.fdopen(read_fd, "rb") as f:
        report = f.read(4096)
    layers = tuple(json.loads(report)) if report else ()
    return proc.returncode, timed_out, outer + layers, wall, cpu_s


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(source: str, limits: Limits = Limits()) -> RunResult:
    """Run `source` as a program in a fresh sandbox; never raises for anything the program does. Raises
    SandboxUnavailable, before anything runs, when no OS layer would hold and weak sandboxes are not allowed.
    A starved run (see STARVED_CPU_SHARE) is run once more when `limits.rerun_starved`."""
    result = _run_once(source, limits)
    if limits.rerun_starved and starved(result.status, result.error, result.cpu_s, limits.timeout_s):
        result = replace(_run_once(source, limits), reruns=1)
    return result


def _run_once(source: str, limits: Limits) -> RunResult:
    if not limits.allow_weak_sandbox:
        require_os_layer(describe(limits))
    root = Path(tempfile.mkdtemp(prefix="scalelab-sandbox-"))
    try:
        (root / "work").mkdir()
        (root / "io").mkdir()
        (root / "work" / "program.py").write_text(source)
        rc, timed_out, enforced, wall, cpu_s = _spawn(root, limits)
        stdout = _tail(root / "io" / "stdout", limits.max_output_chars)
        stderr = _tail(root / "io" / "stderr", limits.max_output_chars)
    finally:
        _remove_tree(root)
    if not limits.allow_weak_sandbox and not set(enforced) & set(OS_LAYERS):
        # the probe promised an OS layer that this run did not get; the child stopped before the program
        require_os_layer(SandboxInfo(enforced))
    status, error = _classify(rc, timed_out, stderr)
    return RunResult(status, rc, error, stdout, stderr, wall, enforced, cpu_s)


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
    """The layers a default sandbox gets on this host (one trivial run): the capability probe."""
    return run_python("pass", Limits(timeout_s=30, allow_weak_sandbox=True)).enforced


def _family(layer: str) -> str:
    """The `Limits.layers` entry an enforced layer comes from ("landlock-tcp" -> "landlock")."""
    return {"uid-drop": "uid", "audit-hook": "audit", "rlimits": ""}.get(layer, layer.split("-")[0])


@dataclass(frozen=True)
class SandboxInfo:
    layers: tuple[str, ...]  # what a sandbox with these limits gets here, e.g. ("netns", "uid-drop", ...)
    weak_allowed: bool = False

    @property
    def os_isolated(self) -> bool:
        return bool(set(self.layers) & set(OS_LAYERS))

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "os_isolated": self.os_isolated, "weak_allowed": self.weak_allowed}


def describe(limits: Limits = Limits()) -> SandboxInfo:
    """The layers sandboxed code gets on this host under `limits`: for callers to record with their scores."""
    wanted = set(limits.layers) | {""}
    return SandboxInfo(tuple(x for x in available_layers() if _family(x) in wanted), limits.allow_weak_sandbox)


def require_os_layer(info: SandboxInfo) -> None:
    if not info.os_isolated:
        raise SandboxUnavailable(
            f"sandbox: no OS isolation here (layers {', '.join(info.layers) or 'none'}; needs one of "
            f"{', '.join(OS_LAYERS)}): model-written code is not run; set allow_weak_sandbox to run it under "
            f"the Python audit hook and rlimits alone")
