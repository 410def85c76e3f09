"""Alpha-beta cost of one collective: t = alpha + factor(n) · S / B_bus.

S is the message size as nccl-tests counts it (doc/PERFORMANCE.md in NVIDIA/nccl-tests): the buffer
of an all-reduce, the *total* output of an all-gather, the total input of a reduce-scatter, the
per-rank send buffer of an all-to-all. B_bus is "bus bandwidth", the per-GPU link rate a collective
achieves once algorithm overheads are factored out, so that one number describes every collective:

    all-reduce     factor 2(n-1)/n   (ring: reduce-scatter then all-gather; Patarasuk & Yuan 2009)
    all-gather     factor  (n-1)/n   (each rank receives the n-1 chunks it lacks)
    reduce-scatter factor  (n-1)/n
    all-to-all     factor  (n-1)/n   (each rank keeps 1/n of its buffer, sends the rest)
    send/recv      factor  1         (point-to-point, one message)

factor · S is also the number of bytes each GPU sends, which is what we report as volume.
alpha is the whole small-message latency of one collective, as nccl-tests measures it at 8 B: NCCL's
LL/tree protocols keep it far below the ring's textbook 2(n-1)·alpha_hop (Thakur et al. 2005), so we
model it per call, not per ring step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Link:
    bus_bw_bytes_s: float       # B_bus, bytes/s
    latency_s: float            # alpha, seconds per call
    source: str = ""


BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def bus_factor(collective: str, n: int) -> float:
    if collective not in BUS_FACTOR:
        raise KeyError(f"unknown collective {collective!r}; known: {', '.join(BUS_FACTOR)}")
    return BUS_FACTOR[collective](n)


def wire_bytes(collective: str, size_bytes: float, n: int) -> float:
    """Bytes each GPU sends for one call; 0 for a group of one."""
    return 0.0 if n <= 1 else bus_factor(collective, n) * size_bytes


def collective_time_s(collective: str, size_bytes: float, n: int, link: Link) -> float:
    """alpha + factor(n)·S/B_bus; a group of one costs nothing."""
    if n <= 1:
        return 0.0
    return link.latency_s + bus_factor(collective, n) * size_bytes / link.bus_bw_bytes_s


def algbw_bytes_s(size_bytes: float, time_s: float) -> float:
    """nccl-tests algorithm bandwidth S/t."""
    return size_bytes / time_s


def busbw_bytes_s(collective: str, size_bytes: float, n: int, time_s: float) -> float:
    """nccl-tests bus bandwidth: algbw · factor(n)."""
    return algbw_bytes_s(size_bytes, time_s) * bus_factor(collective, n)
