"""Fit the alpha-beta model to measured collectives (bench/nccl_bench.py output, <results>/<hw>/nccl_*.json).

For each collective we fit t(S) = alpha + factor(n)·S/B_bus to the median times over message sizes,
minimising the squared *relative* error (weights 1/t²) so that 8-byte and 1-GiB points count alike:
that is ordinary weighted least squares in (alpha, 1/B_bus), two normal equations, solved exactly.
The fitted alpha and B_bus replace the hardware table's link numbers for intra-node collectives of that
GPU whenever a results file exists (see cluster.make_cluster).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from scalelab.calc.collectives import bus_factor

REPO_ROOT = Path(__file__).resolve().parents[3]
# send/recv is not measured; a 2-rank all-gather moves the same bytes over the same link per rank.
FALLBACK = {"send_recv": "all_gather"}


@dataclass(frozen=True)
class CollectiveFit:
    collective: str
    n_ranks: int
    alpha_s: float
    busbw_bytes_s: float
    max_rel_err: float          # worst |model - measured| / measured over the fitted points
    n_points: int
    source: str

    def predict_s(self, size_bytes: float) -> float:
        return self.alpha_s + bus_factor(self.collective, self.n_ranks) * size_bytes / self.busbw_bytes_s


def fit_line(xs: list[float], times_s: list[float]) -> tuple[float, float]:
    """(alpha, beta) of t = alpha + beta·x by least squares in relative error (weights 1/t²)."""
    if len(xs) < 2 or len(xs) != len(times_s):
        raise ValueError(f"need >= 2 (size, time) points to fit, got {len(xs)}")
    ws = [1.0 / t ** 2 for t in times_s]
    sw = sum(ws)
    swx = sum(w * x for w, x in zip(ws, xs))
    swxx = sum(w * x * x for w, x in zip(ws, xs))
    swt = sum(w * t for w, t in zip(ws, times_s))
    swxt = sum(w * x * t for w, x, t in zip(ws, xs, times_s))
    det = sw * swxx - swx * swx
    alpha = (swt * swxx - swx * swxt) / det
    beta = (sw * swxt - swx * swt) / det
    if alpha < 0:   # the line through the origin, refit for beta alone
        alpha, beta = 0.0, swxt / swxx
    if beta <= 0:   # flat: latency-bound at every size; take bandwidth from the largest message
        i = max(range(len(xs)), key=lambda j: xs[j])
        beta = max(times_s[i] - alpha, 1e-12) / xs[i]
    return alpha, beta


def fit_alpha_beta(collective: str, n_ranks: int, sizes: list[float], times_s: list[float],
                   source: str = "") -> CollectiveFit:
    if len(sizes) < 2 or len(sizes) != len(times_s):
        raise ValueError(f"{collective}: need >= 2 (size, time) points to fit, got {len(sizes)}")
    alpha, beta = fit_line([bus_factor(collective, n_ranks) * s for s in sizes], times_s)
    fit = CollectiveFit(collective, n_ranks, alpha, 1.0 / beta, 0.0, len(sizes), source)
    err = max(abs(fit.predict_s(s) - t) / t for s, t in zip(sizes, times_s))
    return CollectiveFit(collective, n_ranks, alpha, 1.0 / beta, err, len(sizes), source)


def fits_from_results(data: dict, source: str) -> dict[str, CollectiveFit]:
    """One fit per collective from a bench JSON document."""
    n = int(data["world_size"])
    points: dict[str, list[tuple[float, float]]] = {}
    for row in data["results"]:
        points.setdefault(row["collective"], []).append((float(row["size_bytes"]), float(row["time_s"])))
    return {c: fit_alpha_beta(c, n, [s for s, _ in pts], [t for _, t in pts], source)
            for c, pts in points.items() if len(pts) >= 2}


def results_dir() -> Path:
    return Path(os.environ.get("SCALELAB_RESULTS_DIR", REPO_ROOT / "results"))


def load_calibration(hw_key: str, root: Path | None = None) -> dict[str, CollectiveFit]:
    """Fits from <results>/<hw_key>/nccl_*.json (the last file in name order wins per collective); {} if none."""
    folder = (root or results_dir()) / hw_key
    fits: dict[str, CollectiveFit] = {}
    for path in sorted(folder.glob("nccl_*.json")):
        data = json.loads(path.read_text())
        if data.get("backend", "nccl") != "nccl" and hw_key != "cpu":
            continue    # a gloo smoke run says nothing about the GPU's links
        fits.update(fits_from_results(data, str(path)))
    for missing, proxy in FALLBACK.items():
        if missing not in fits and proxy in fits:
            p = fits[proxy]
            fits[missing] = CollectiveFit(missing, p.n_ranks, p.alpha_s, p.busbw_bytes_s, p.max_rel_err,
                                          p.n_points, f"{p.source} ({proxy} used as proxy)")
    return fits
