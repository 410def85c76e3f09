"""Score calc's collective-time terms on collective measurements, not on training steps.

A step-time check hides the communication term under compute: a 124M DDP step is ~0.5 s and its
all-reduces are ~2 ms, so a step predicted within 2% says nothing about whether the ~2 ms is right.
Here every (collective, message size) point of an nccl-tests-style sweep is predicted by three models
and compared with its measured median time:

    prior   the hardware table's link (core/hardware.py: datasheet NVLink rate, assumed latency),
            fitted on nothing; every point is held out
    loo     calc's alpha-beta fit (calc/calibration.py) refitted per point with that point left out
            (leave-one-size-out within its collective)
    cross   one (alpha, B_bus) fitted on the *other* collectives of the sweep, pooled, predicting
            every size of the held-out collective: the claim nccl-tests' bus bandwidth makes, that one
            number describes every collective once its factor(n) is applied

No point is scored by a model that was fitted on it. Regimes split the rows by message size, since
the latency term and the bandwidth term are separate claims.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Iterable

from scalelab.calc.calibration import fit_line
from scalelab.calc.collectives import Link, bus_factor, collective_time_s

LATENCY_MAX_BYTES = 1 << 20          # below: alpha dominates on NVLink (alpha·B_bus ~ a few MB)
BANDWIDTH_MIN_BYTES = 32 << 20       # above: the bandwidth term is > 80% of the time
METHODS = ("prior", "loo", "cross")


@dataclass(frozen=True)
class Point:
    collective: str
    size_bytes: float
    time_s: float                    # measured median of one call


@dataclass(frozen=True)
class Scored:
    method: str
    collective: str
    size_bytes: float
    measured_s: float
    predicted_s: float
    fitted_on: str                   # which points the model saw; never this one

    @property
    def rel_err(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def regime(self) -> str:
        return regime(self.size_bytes)


@dataclass(frozen=True)
class Summary:
    method: str
    regime: str                      # latency | middle | bandwidth | all
    n: int
    within_15pct: int
    median_abs_err: float
    worst_abs_err: float
    worst_point: str


def regime(size_bytes: float) -> str:
    if size_bytes < LATENCY_MAX_BYTES:
        return "latency"
    return "bandwidth" if size_bytes >= BANDWIDTH_MIN_BYTES else "middle"


def points_from_bench(doc: dict) -> tuple[int, list[Point]]:
    """World size and points of a bench/nccl_bench.py document (median time per size)."""
    rows = doc.get("results")
    if not isinstance(rows, list) or "world_size" not in doc:
        raise ValueError("not a collectives bench document: needs 'world_size' and a 'results' list")
    return int(doc["world_size"]), [Point(r["collective"], float(r["size_bytes"]), float(r["time_s"])) for r in rows]


def _fit(points: Iterable[Point], n: int) -> tuple[float, float]:
    """(alpha_s, B_bus bytes/s) of the pooled points, each in its own collective's factor."""
    pts = list(points)
    alpha, beta = fit_line([bus_factor(p.collective, n) * p.size_bytes for p in pts], [p.time_s for p in pts])
    return alpha, 1.0 / beta


def _predict(p: Point, n: int, alpha_s: float, busbw: float) -> float:
    return collective_time_s(p.collective, p.size_bytes, n, Link(busbw, alpha_s))


def score_prior(points: list[Point], n: int, link: Link) -> list[Scored]:
    return [Scored("prior", p.collective, p.size_bytes, p.time_s,
                   collective_time_s(p.collective, p.size_bytes, n, link), "nothing (hardware table)")
            for p in points]


def score_loo(points: list[Point], n: int) -> list[Scored]:
    out = []
    for p in points:
        rest = [q for q in points if q.collective == p.collective and q is not p]
        alpha, bw = _fit(rest, n)
        out.append(Scored("loo", p.collective, p.size_bytes, p.time_s, _predict(p, n, alpha, bw),
                          f"{len(rest)} other sizes of {p.collective}"))
    return out


def score_cross(points: list[Point], n: int) -> list[Scored]:
    out = []
    for held in sorted({p.collective for p in points}):
        rest = [q for q in points if q.collective != held]
        alpha, bw = _fit(rest, n)
        others = ", ".join(sorted({q.collective for q in rest}))
        out.extend(Scored("cross", p.collective, p.size_bytes, p.time_s, _predict(p, n, alpha, bw), others)
                   for p in points if p.collective == held)
    return out


def summarize(rows: list[Scored], tolerance: float = 0.15) -> list[Summary]:
    """One line per (method, regime) and per method over all sizes."""
    out = []
    for method in METHODS:
        mine = [r for r in rows if r.method == method]
        for reg in ("latency", "middle", "bandwidth", "all"):
            sel = [r for r in mine if reg == "all" or r.regime == reg]
            if not sel:
                continue
            worst = max(sel, key=lambda r: abs(r.rel_err))
            out.append(Summary(method, reg, len(sel), sum(abs(r.rel_err) <= tolerance for r in sel),
                               median(abs(r.rel_err) for r in sel), abs(worst.rel_err),
                               f"{worst.collective} {worst.size_bytes:.0f} B"))
    return out


def bucketed_all_reduce_s(grad_bytes: float, bucket_bytes: float, n: int, link: Link) -> float:
    """Total all-reduce time of a gradient reduced in DDP's buckets, nothing overlapped: an upper bound
    on the communication a DDP step can expose (PyTorch DDP, Li et al. 2020, buckets of 25 MB)."""
    full, rest = divmod(grad_bytes, bucket_bytes)
    t = full * collective_time_s("all_reduce", bucket_bytes, n, link)
    return t + (collective_time_s("all_reduce", rest, n, link) if rest else 0.0)
