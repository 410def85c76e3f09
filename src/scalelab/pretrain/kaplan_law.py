"""Kaplan et al. 2020's joint loss law L(N, D) = [(N_c / N)^(α_N/α_D) + D_c / D]^α_D (their eq. 1.5).

Unlike the additive form E + A/N^α + B/D^β, the gain from a larger model here depends on the data: while D_c/D
dominates (little data) the size term barely moves the loss, and it matters more as D grows. That is the pattern
the ladder's additive fit leaves in its residuals, so this form is fitted beside it and scored the same way.

Fit without an iterative optimiser: for fixed (α_D, r = α_N/α_D), y = L^(1/α_D) = c1·N^(-r) + c2/D is linear in
c1 = N_c^r and c2 = D_c, both >= 0. A grid over (α_D, r), its best few pairs refined, takes the pair whose
least-squares (c1, c2) gives the smallest RMS error of log-loss, the objective scaling_law.fit_scaling_law uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from scalelab.pretrain.scaling_law import MIN_FIT_INTERVAL, LossPoint


@dataclass(frozen=True)
class KaplanLaw:
    n_c: float
    d_c: float
    alpha_n: float
    alpha_d: float
    rel_interval: float     # stated half-width of the prediction interval, as a fraction of the loss
    source: str

    def loss(self, n_params: float, tokens: float) -> float:
        return ((self.n_c / n_params) ** (self.alpha_n / self.alpha_d) + self.d_c / tokens) ** self.alpha_d


def _grid(n: np.ndarray, d: np.ndarray, y: np.ndarray, alphas_d: np.ndarray, ratios: np.ndarray) -> list[tuple]:
    """(rms, α_D, r, c1, c2) for every grid pair with non-negative coefficients, best first."""
    out = []
    for a_d in alphas_d:
        target = y ** (1.0 / a_d)
        for r in ratios:
            design = np.stack([n ** -r, 1.0 / d], axis=1)
            scale = design.max(axis=0)                    # column scaling for conditioning
            coef, *_ = np.linalg.lstsq(design / scale, target, rcond=None)
            c1, c2 = coef / scale
            if c1 < 0 or c2 < 0:
                continue
            pred = (c1 * n ** -r + c2 / d) ** a_d
            out.append((float(np.sqrt(np.mean((np.log(pred) - np.log(y)) ** 2))), a_d, r, c1, c2))
    return sorted(out, key=lambda t: t[0])


def _refine(n, d, y, start: tuple, step: float) -> tuple:
    """Two levels, each ±one step around the best so far and ten times finer."""
    best = start
    for _ in range(2):
        _, a_d, r, _, _ = best
        alphas = np.arange(max(0.005, a_d - step), a_d + step * 1.05, step / 10)
        ratios = np.arange(max(0.005, r - step), r + step * 1.05, step / 10)
        best = min([best, *_grid(n, d, y, alphas, ratios)[:1]], key=lambda t: t[0])
        step /= 10
    return best


def fit_kaplan_law(points: Sequence[LossPoint], source: str = "fit", keep: int = 8) -> KaplanLaw:
    """α_D in [0.02, 1.0] and r in [0.05, 3.0] by 0.02; the `keep` best pairs refined (the surface has several
    shallow basins when the size effect is small, and one coarse winner can sit in the wrong one)."""
    if len(points) < 5:
        raise ValueError(f"fit_kaplan_law: {len(points)} points; need >= 5 (4 parameters), spanning N and D")
    n = np.array([p.n_params for p in points], dtype=np.float64)
    d = np.array([p.tokens for p in points], dtype=np.float64)
    y = np.array([p.loss for p in points], dtype=np.float64)
    coarse = _grid(n, d, y, np.arange(0.02, 1.0001, 0.02), np.arange(0.05, 3.0001, 0.02))
    if not coarse:
        raise ValueError("fit_kaplan_law: no (alpha_D, ratio) pair gives non-negative N_c, D_c")
    rms, a_d, r, c1, c2 = min((_refine(n, d, y, c, 0.02) for c in coarse[:keep]), key=lambda t: t[0])
    return KaplanLaw(n_c=float(c1 ** (1.0 / r)), d_c=float(c2), alpha_n=float(r * a_d), alpha_d=float(a_d),
                     rel_interval=max(MIN_FIT_INTERVAL, 2.0 * rms), source=f"{source}: {len(points)} runs")
