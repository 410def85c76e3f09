"""Exposed communication of a data-parallel step, measured two ways.

A/B    the same step with and without its gradient collectives, interleaved repeats on the same ranks:
       DDP skips every gradient all-reduce under `require_backward_grad_sync = False`; FSDP2 skips the
       gradient reduce-scatter under `set_requires_gradient_sync(False)` (its parameter all-gathers still
       run, so the A/B prices the reduce-scatters only). exposed = median(sync) - median(no sync).
trace  from a profiler trace of the GPU: the union of collective-kernel time (NCCL kernels) minus the
       part of it covered by compute kernels on other streams. This counts every collective, FSDP2's
       all-gathers too, and needs CUDA (a gloo collective runs on the host, not as a kernel).

"Step residual" (2-GPU step - 1-GPU step / 2) is neither: it also holds the work every rank repeats (the
optimizer step, the norm clip), per-step host overheads that do not halve, and the slower of the two GPUs
setting the pace of every step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

COLLECTIVE_KERNEL = re.compile(r"nccl", re.I)        # NCCL names every device kernel ncclDevKernel_* / ncclKernel_*


@dataclass(frozen=True)
class ABExposed:
    sync_step_s: float               # median step with the gradient collectives
    nosync_step_s: float             # median step without them
    exposed_s: float                 # sync - nosync
    spread_s: float                  # max - min over repeats of (sync - nosync), paired by repeat
    repeats: int


@dataclass(frozen=True)
class TraceExposed:
    collective_s: float              # union of collective-kernel intervals
    exposed_s: float                 # the part of it no compute kernel overlaps
    compute_s: float                 # union of all other kernel intervals
    steps: int

    @property
    def overlapped_share(self) -> float:
        return 1.0 - self.exposed_s / self.collective_s if self.collective_s else 0.0


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted [start, end) intervals covering the same time."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in union(intervals))


def overlap(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Length of union(a) ∩ union(b): two pointers over the two sorted, disjoint lists."""
    ua, ub, i, j, total = union(a), union(b), 0, 0, 0.0
    while i < len(ua) and j < len(ub):
        total += max(0.0, min(ua[i][1], ub[j][1]) - max(ua[i][0], ub[j][0]))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def uncovered(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Length of union(a) that union(b) does not cover."""
    return length(a) - overlap(a, b)


def ab_exposed(sync_s: Sequence[float], nosync_s: Sequence[float]) -> ABExposed:
    """Interleaved repeats: sync_s[i] and nosync_s[i] ran back to back (step seconds, one value per repeat)."""
    if len(sync_s) != len(nosync_s) or not sync_s:
        raise ValueError(f"need paired repeats, got {len(sync_s)} with and {len(nosync_s)} without collectives")
    diffs = [a - b for a, b in zip(sync_s, nosync_s)]
    return ABExposed(median(sync_s), median(nosync_s), median(sync_s) - median(nosync_s),
                     max(diffs) - min(diffs), len(diffs))


def kernel_intervals(trace: dict) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(collective, compute) kernel intervals in seconds from a Chrome trace (torch.profiler export)."""
    comm, compute = [], []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") != "kernel":
            continue
        span = (ev["ts"] * 1e-6, (ev["ts"] + ev.get("dur", 0.0)) * 1e-6)
        (comm if COLLECTIVE_KERNEL.search(ev.get("name", "")) else compute).append(span)
    return comm, compute


def trace_exposed(trace: dict, steps: int) -> TraceExposed:
    """Per-step collective, exposed and compute seconds of a trace that covers `steps` steps."""
    comm, compute = kernel_intervals(trace)
    return TraceExposed(length(comm) / steps, uncovered(comm, compute) / steps, length(compute) / steps, steps)
