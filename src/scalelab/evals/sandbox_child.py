"""The sandboxed side of `sandbox.py`: confine this process, then run the untrusted program.

Run as `python -I -S -B sandbox_child.py CONFIG.json` (stdlib only: it must not import scalelab, whose
site-packages `-S` leaves out). The order matters: every limit is in place before the first line of
untrusted code runs, and nothing done here can be undone from Python afterwards.

  1. rlimits (kernel): address space, CPU seconds, processes, file size, no core files.
  2. Landlock (kernel, Linux >= 5.13, when the kernel has it enabled): writes only beneath the work dir,
     reads only from the Python stdlib, system libraries and the work dir; with ABI >= 4 no TCP
     bind/connect; with ABI >= 6 no signals to, and no abstract unix sockets of, processes outside.
     Landlock also denies ptrace-style access to outside processes, so /proc/<parent>/environ is closed.
  3. An audit hook (Python level, PEP 578; hooks cannot be removed once added): refuses process
     creation (and importing _posixsubprocess), sockets, ctypes, rlimit changes, /proc of other
     processes, writes outside the work dir and creating native extension files. Native code could
     bypass it, which is why ctypes is refused and why the kernel layers above are the guarantee where
     they are available.
The network namespace (no interface but a down loopback) is set up by the parent with `unshare`, and a
root parent starts this process as an unprivileged uid (so that RLIMIT_NPROC binds). Unless the parent allows
a weak sandbox, the program is not run when none of these OS layers holds.
"""
from __future__ import annotations

import json
import os
import resource
import sys

# ---------------------------------------------------------------------------------------------
# rlimits

MIB = 1 << 20


def apply_rlimits(cfg: dict) -> None:
    cpu = int(cfg["cpu_s"])
    # CPU: the soft limit sends SIGXCPU, the hard one (a second later) SIGKILL.
    limits = {resource.RLIMIT_AS: cfg["memory_mb"] * MIB, resource.RLIMIT_CPU: (cpu, cpu + 1),
              resource.RLIMIT_NPROC: cfg["max_processes"], resource.RLIMIT_FSIZE: cfg["max_file_mb"] * MIB,
              resource.RLIMIT_CORE: 0}
    for which, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        resource.setrlimit(which, (soft, hard))


# ---------------------------------------------------------------------------------------------
# Landlock (include/uapi/linux/landlock.h); syscall numbers are the same on every architecture.

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
PR_SET_NO_NEW_PRIVS = 38
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE = 1 << 14
FS_READ = FS_READ_FILE | FS_READ_DIR


def _fs_handled(abi: int) -> int:
    # v1: bits 0-12 (execute .. make_sym); v2 adds REFER (13); v3 adds TRUNCATE (14). IOCTL_DEV (v5)
    # is left unhandled: it only governs ioctls on device files, which read rules already gate.
    bits = (1 << 13) - 1
    bits |= (1 << 13) if abi >= 2 else 0
    bits |= FS_TRUNCATE if abi >= 3 else 0
    return bits


def read_roots() -> list[str]:
    """What the interpreter itself must read after confinement: the stdlib (lazy imports), shared
    libraries (extension modules link against them) and time zones."""
    stdlib = os.path.dirname(os.__file__)
    roots = [stdlib, os.path.join(sys.base_prefix, "lib"), "/lib", "/lib64", "/usr/lib", "/usr/lib64",
             "/usr/share/zoneinfo", "/etc/ld.so.cache"]
    return [r for r in dict.fromkeys(roots) if os.path.exists(r)]


def _add_rule(libc, ctypes, ruleset: int, path: str, access: int) -> None:
    class PathBeneath(ctypes.Structure):  # struct landlock_path_beneath_attr is packed
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = PathBeneath(access, fd)
        if libc.syscall(SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:  # 1 = RULE_PATH_BENEATH
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def forget_ctypes() -> None:
    # Landlock needs ctypes; the program must not inherit it already loaded (with `pythonapi` and
    # `memmove` in hand): a fresh import re-runs ctypes' own dlopen, which the audit hook refuses.
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def apply_landlock(workdir: str) -> list[str]:
    """Restrict this process (and its future children) with Landlock; the layers applied, [] if none."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_CREATE_RULESET, None, 0, 1)  # 1 = LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return []
    fs = _fs_handled(abi)
    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, with no rule allowing any port
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return []
    try:
        for root in read_roots():
            _add_rule(libc, ctypes, ruleset, root, FS_READ_FILE if os.path.isfile(root) else FS_READ)
        file_rw = FS_READ_FILE | FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
        for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
            _add_rule(libc, ctypes, ruleset, dev, file_rw)
        _add_rule(libc, ctypes, ruleset, workdir, fs)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
        forget_ctypes()
    return ["landlock-fs"] + (["landlock-tcp"] if net else []) + (["landlock-scope"] if scoped else [])


# ---------------------------------------------------------------------------------------------
# audit hook

REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
    "os.kill", "os.killpg", "socket.__new__", "socket.socketpair", "socket.fromfd", "socket.connect",
    "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto", "ctypes.dlopen",
    "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "resource.setrlimit", "resource.prlimit", "sys.remote_exec",
})
# Modules that reach process creation or foreign calls without raising an audit event of their own
# (_posixsubprocess.fork_exec even runs a Python callable in the forked child).
REFUSED_MODULES = frozenset({"_posixsubprocess", "_ctypes"})
PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
               "os.truncate": 1, "os.chmod": 1, "os.chown": 1, "os.utime": 1, "shutil.rmtree": 1,
               "os.setxattr": 1, "os.removexattr": 1, "os.chflags": 1}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
WRITABLE_DEVICES = ("/dev/null",)


def make_audit_hook(workdir: str):
    own_proc = (f"/proc/{os.getpid()}", "/proc/self", "/proc/thread-self")

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: it was checked when it was opened
        real = os.path.realpath(os.fsdecode(path))
        return real == workdir or real.startswith(workdir + os.sep) or real in WRITABLE_DEVICES

    def is_write(mode: object, flags: object) -> bool:
        if isinstance(mode, str):
            return any(c in mode for c in "wax+")
        return isinstance(flags, int) and bool(flags & WRITE_FLAGS)

    def refuse(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if event in REFUSED_EVENTS:
            refuse(event)
        if event == "import" and args[0] in REFUSED_MODULES:
            refuse(f"importing {args[0]}")
        if event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)) and os.fsdecode(path).startswith("/proc/") \
                    and not os.fsdecode(path).startswith(own_proc):
                refuse(f"reading {os.fsdecode(path)}")
            if is_write(args[1], args[2]) and not inside(path):
                refuse(f"writing {path!r} (outside the work dir)")
            if is_write(args[1], args[2]) and os.fsdecode(str(path)).endswith(NATIVE_SUFFIXES):
                refuse(f"creating native code {path!r}")
        elif event in PATH_EVENTS:
            for path in args[:PATH_EVENTS[event]]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    refuse(f"{event} on {path!r} (outside the work dir)")
            if event == "os.rename" and os.fsdecode(args[1]).endswith(NATIVE_SUFFIXES):
                refuse(f"creating native code {args[1]!r}")

    return hook


# ---------------------------------------------------------------------------------------------
# main


def confine(cfg: dict) -> list[str]:
    workdir = os.path.realpath(cfg["workdir"])
    applied = []
    if "landlock" in cfg["layers"]:
        try:
            applied += apply_landlock(workdir)
        except OSError as e:
            if cfg.get("require_landlock"):
                raise
            print(f"sandbox: landlock unavailable ({e})", file=sys.stderr)
    apply_rlimits(cfg)
    applied.append("rlimits")
    if "audit" in cfg["layers"]:
        sys.addaudithook(make_audit_hook(workdir))
        applied.append("audit-hook")
    return applied


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    with open(cfg["program"]) as f:
        source = f.read()
    applied = confine(cfg)
    # Tell the parent what is enforced before any untrusted code can write to this descriptor.
    os.write(cfg["report_fd"], json.dumps(applied).encode())
    os.close(cfg["report_fd"])
    if cfg["require_os_layer"] and not set(cfg["outer_layers"] + applied) & set(cfg["os_layers"]):
        # Landlock failed here although the parent's probe had it: hook and rlimits alone are not enough
        sys.exit("sandbox: no OS isolation layer held; the program was not run")
    del cfg
    sys.argv = [sys.argv[0]]
    code = compile(source, "program.py", "exec")
    exec(code, {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
