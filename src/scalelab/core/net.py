"""Local networking helpers shared by the jobs that launch servers or process groups."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on `host` now (bound to port 0, then released). Another process may
    take it before the caller binds it; launchers that need certainty retry on a bind error."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
