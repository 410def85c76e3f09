"""An exclusive lock on a file, for processes of one host that share a folder: a DPO battery's shared base
records, a GGUF conversion in the model cache, vLLM engine starts. flock locks belong to an open file, so
threads that open the file apart exclude each other too; the kernel drops the lock when its holder dies."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from scalelab.core.errors import ScalelabError


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[float]:
    """Hold an exclusive lock on `path` (created with its folder if missing); yields the seconds spent waiting."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        t0 = time.perf_counter()
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - t0
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class LockHeld(ScalelabError, RuntimeError):
    """Another process holds the lock that exclusive_or_fail asked for."""


@contextlib.contextmanager
def exclusive_or_fail(path: str | Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` without waiting: a second writer of one folder (a command started twice on
    the same output) fails at once with a LockHeld naming `what`, the lock file and the holder's pid, instead of
    interleaving its records with the first one's. The pid is written into the lock file while it is held."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise LockHeld(f"{what}: another process (pid {holder}) holds {path}; wait for it to end or stop "
                           "it") from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def made_once(out: Path, done: Path, lock: Path, make: Callable[[], Path]) -> Path:
    """`out` when the file `done` exists, else `make()` run by one process of the host at a time: jobs started side
    by side (a DPO sweep beside GRPO runs) convert once, the others wait on `lock`, then find `done` and reuse it."""
    if done.is_file():
        return out
    with file_lock(lock):
        return out if done.is_file() else make()
