"""How many of a step's groups carry a learning signal, and how that would change with the group size: a forecast
from a run's own rollouts, written before the run that changes G.

GRPO's advantage is a reward minus its group's mean, so a group whose G answers are all right or all wrong teaches
nothing (advantages.zero_signal_fraction; DAPO's dynamic sampling, Yu et al. 2025, resamples such groups away).
Whether a prompt's group is uniform depends on the policy's pass rate p on that prompt: P = p^G + (1 - p)^G. The
pass rates over prompts are fitted as a Beta(a, b) from the logged per-group correct counts (a beta-binomial,
method of moments), which gives the uniform share at any other G with the same sequences per step:

    correct_counts(steps, G) -> array of k per group          from metrics.jsonl's completion_rewards
    fit_beta_binomial(k, G) -> (a, b)
    forecast(a, b, sizes, sequences) -> [GroupSignal]          per G: uniform share, prompts and rows with signal
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class GroupSignal:
    group_size: int
    prompts: int             # sequences // group_size
    zero_signal: float       # expected share of groups whose answers are all right or all wrong
    prompts_with_signal: float
    rows_with_signal: float  # sequences in groups that carry a gradient


def correct_counts(steps: Iterable[dict], group_size: int, reward: str = "correctness",
                   threshold: float = 1.0) -> np.ndarray:
    """Right answers per group over the steps' `completion_rewards[reward]` (group-major, as rolled out)."""
    counts = []
    for s in steps:
        rewards = np.asarray(s["completion_rewards"][reward], dtype=float)
        if rewards.size % group_size:
            raise ValueError(f"step {s.get('step')}: {rewards.size} rewards are not groups of {group_size}")
        counts.append((rewards.reshape(-1, group_size) >= threshold).sum(axis=1))
    if not counts:
        raise ValueError("no steps with completion_rewards to count")
    return np.concatenate(counts)


def fit_beta_binomial(k: Sequence[int], n: int) -> tuple[float, float]:
    """Beta(a, b) of the pass rates behind counts k of n, by the first two moments: the counts' variance beyond
    the binomial's gives the intra-prompt correlation rho = 1 / (a + b + 1)."""
    k = np.asarray(k, dtype=float)
    m = k.mean() / n
    if not 0.0 < m < 1.0:
        raise ValueError(f"mean pass rate {m:.3f}: every group all right or all wrong, no spread to fit")
    rho = (k.var() / (n * m * (1 - m)) - 1) / (n - 1)
    if not 0.0 < rho < 1.0:
        raise ValueError(f"intra-prompt correlation {rho:.3f} outside (0, 1): the counts are not overdispersed as "
                         "a beta-binomial's are")
    total = 1 / rho - 1
    return m * total, (1 - m) * total


def zero_signal(a: float, b: float, group_size: int) -> float:
    """Expected share of groups of `group_size` whose answers all agree, pass rates ~ Beta(a, b):
    E[(1 - p)^G] + E[p^G] = B(a, b + G) / B(a, b) + B(a + G, b) / B(a, b)."""
    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    base = log_beta(a, b)
    return math.exp(log_beta(a, b + group_size) - base) + math.exp(log_beta(a + group_size, b) - base)


def forecast(a: float, b: float, sizes: Sequence[int], sequences: int) -> list[GroupSignal]:
    out = []
    for g in sizes:
        z, prompts = zero_signal(a, b, g), sequences // g
        out.append(GroupSignal(g, prompts, z, prompts * (1 - z), prompts * g * (1 - z)))
    return out
