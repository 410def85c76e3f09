"""Waiting times of single-server queues with Poisson arrivals (Kleinrock 1975, Queueing Systems vol. 1).

- M/G/1, Pollaczek-Khinchine: W = lambda·E[S²] / (2(1 - rho)), rho = lambda·E[S] (Kleinrock vol. 1, ch. 5).
  With deterministic S this is DistServe's M/D/1 prefill model (Zhong et al. 2024 sec. 3.1).
- Non-preemptive priority (Cobham 1954): class 1 waits W_1 = R / (1 - rho_1), where R is the mean
  residual work in service seen by an arrival, summed over all classes (Kleinrock vol. 2, ch. 3).
  A colocated engine that schedules prefills first but cannot interrupt a running decode step is
  this queue: R = lambda·E[S²]/2 + (share of time decoding)·t_step/2.
- Tail: P(W > t) ~ q·exp(-t·q/E[W]) with q = P(W > 0) (the exponential heavy-traffic approximation,
  Kingman 1962), so the p-quantile is (E[W]/q)·ln(q/(1-p)) when q > 1-p, else 0.
"""
from __future__ import annotations

import math


def mg1_wait_s(rate: float, es: float, es2: float) -> float:
    rho = rate * es
    return math.inf if rho >= 1 else rate * es2 / (2 * (1 - rho))


def priority_wait_s(rate: float, es: float, es2: float, other_residual_s: float) -> float:
    """Mean wait of the high-priority class; `other_residual_s` is the lower classes' part of R."""
    rho = rate * es
    return math.inf if rho >= 1 else (rate * es2 / 2 + other_residual_s) / (1 - rho)


def wait_quantile_s(mean_wait_s: float, p_wait: float, q: float = 0.9) -> float:
    if math.isinf(mean_wait_s):
        return math.inf
    if p_wait <= 1 - q or mean_wait_s <= 0:
        return 0.0
    return mean_wait_s / p_wait * math.log(p_wait / (1 - q))
