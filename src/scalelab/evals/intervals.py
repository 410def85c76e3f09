"""Confidence intervals for the scores an evaluation reports: a share of items right, or a mean of per-item values."""
from __future__ import annotations

import math

Z95 = 1.959964  # the two-sided 95% quantile of the standard normal


def wilson_interval(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion p observed on n items (Wilson 1927, JASA 22(158)).
    Unlike p ± z·sqrt(p(1-p)/n) it stays inside [0, 1] and keeps a width at p = 0 or 1, where small-model
    scores on hard tasks often sit."""
    if n <= 0:
        raise ValueError(f"wilson_interval: n must be > 0, got {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"wilson_interval: p must be in [0, 1], got {p}")
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_interval(mean: float, stderr: float, z: float = Z95) -> tuple[float, float]:
    """mean ± z·stderr: for a mean of per-item values in [0, 1] that are not right/wrong verdicts
    (TruthfulQA MC2's probability mass), where no binomial interval applies."""
    return mean - z * stderr, mean + z * stderr
