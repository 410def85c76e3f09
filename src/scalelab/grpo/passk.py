"""Held-out statistics: the unbiased pass@k estimator, the paired bootstrap of a before/after difference, and the
interval of a mean over training seeds. Pure functions of plain numbers.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with n samples of which c
are correct, the probability that k samples drawn without replacement contain a correct one is
    pass@k = 1 - C(n - c, k) / C(n, k),
averaged over problems. For k = 1 it is c / n. Computed as a product to stay exact for large n.

The paired bootstrap (Efron & Tibshirani 1993, ch. 13.3) resamples examples, keeping each example's base score
with its own trained score, so the interval of mean(trained - base) reflects their correlation.

Across seeds the unit is a whole training run: the mean gain of S runs gets Student's t interval with S - 1
degrees of freedom (the seeds are few, so a bootstrap over them would be coarse).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples with c correct (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    if len(ns) != len(cs) or not ns:
        raise ValueError(f"need one (n, c) per problem, got {len(ns)} n and {len(cs)} c")
    return float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)]))


@dataclass(frozen=True)
class PairedDelta:
    """mean(trained) - mean(base) over the same examples, with its percentile-bootstrap interval."""
    n: int
    base: float
    trained: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0


def paired_bootstrap(base: Sequence[float], trained: Sequence[float], resamples: int = 10_000,
                     confidence: float = 0.95, seed: int = 0) -> PairedDelta:
    b, t = np.asarray(base, dtype=float), np.asarray(trained, dtype=float)
    if b.ndim != 1 or b.shape != t.shape or b.size == 0:
        raise ValueError(f"paired scores: two equal-length non-empty lists, got {b.shape} and {t.shape}")
    d, rng = t - b, np.random.default_rng(seed)
    chunk = max(1, 2**22 // d.size)  # resamples per draw of (chunk, n) example indices: bounded memory
    means = np.concatenate([d[rng.integers(0, d.size, size=(min(chunk, resamples - i), d.size))].mean(axis=1)
                            for i in range(0, resamples, chunk)])
    alpha = 1.0 - confidence
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return PairedDelta(int(d.size), float(b.mean()), float(t.mean()), float(d.mean()), float(lo), float(hi),
                       confidence)


@dataclass(frozen=True)
class SeedInterval:
    """Mean of per-seed values with Student's t interval (None with a single seed)."""
    n_seeds: int
    mean: float
    std: float  # sample standard deviation (ddof = 1); 0 with one seed
    ci_low: float | None
    ci_high: float | None
    confidence: float


def seed_interval(values: Sequence[float], confidence: float = 0.95) -> SeedInterval:
    from scipy.stats import t as student_t  # lazy: scipy takes a second to import
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("seed_interval: no values")
    if v.size == 1:
        return SeedInterval(1, float(v[0]), 0.0, None, None, confidence)
    sd = float(v.std(ddof=1))
    half = float(student_t.ppf(0.5 + confidence / 2, df=v.size - 1)) * sd / np.sqrt(v.size)
    return SeedInterval(int(v.size), float(v.mean()), sd, float(v.mean() - half), float(v.mean() + half),
                        confidence)
