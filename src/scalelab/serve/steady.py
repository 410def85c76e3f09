"""The steady state of an endless closed loop of B requests on one instance (continuous batching, Yu et al.
2022; chunked prefill merged into decode steps, Agrawal et al. 2024), from the step model.

Workload: c = sum_i (P_i·O_i + O_i(O_i-1)/2) / sum_i O_i (token-weighted context of a decoding request).
KV cap: running batch b = min(B, max_num_seqs, KV tokens / c); the other B - b requests queue (vLLM waits
for free blocks), which adds (B - b)/lambda to their TTFT.
Gaps (ITL): a decode step at b sequences, plus the prefills of the others merged into it: k ~ Poisson((b-1)/E[O])
new prompts per step (each request brings one prompt per E[O] steps), their prompts drawn from the workload
(capped at max_num_batched_tokens). ITL p50/p99 = quantiles of that step-time mixture.
TTFT_i = R + queue wait + W + S_i: R = the request's own cost outside the steps (request_overhead_s); W = the
step the engine launched just before request i arrived (a closed-loop request is sent when another finishes,
and the engine starts its next step at once), a whole step of the gap mixture, 0 at B = 1 (the engine is idle);
S_i = the step(s) carrying request i's own prompt.
Throughput = B·E[O] / (E[TTFT] + (E[O] - 1)·E[ITL]) (Little's law over the closed loop).
Goodput share = mean_i P(TTFT_i <= slo.ttft_s) · P(request i's judged gap <= slo.itl_s), the judged gap being
its 0.99 quantile (serve.metrics.request_itl_s): it misses iff more than n - ceil(0.99(n-1)) - 1 of its
n = O_i - 1 gaps exceed the SLO, a binomial count with the mixture's exceedance probability.
GPU-hours per 1M output tokens = tp / (throughput · 3600) · 1e6.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from scalelab.serve.metrics import SLO
from scalelab.serve.rows import RowFigures, RowKey
from scalelab.serve.stepmodel import StepModel


@dataclass(frozen=True)
class Lengths:
    prompts: np.ndarray = field(compare=False)     # (n,) prompt tokens per request
    outputs: np.ndarray = field(compare=False)     # (n,) output tokens per request

    @property
    def output_mean(self) -> float:
        return float(self.outputs.mean())

    @property
    def context_mean(self) -> float:
        """Token-weighted KV context of a decoding request: sum(P·O + O(O-1)/2) / sum(O)."""
        p, o = self.prompts, self.outputs
        return float((p * o + o * (o - 1) / 2).sum() / o.sum())


def lengths(prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> Lengths:
    p, o = np.asarray(prompt_tokens, float), np.asarray(output_tokens, float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError(f"prompt_tokens ({p.size}) and output_tokens ({o.size}) must be equal, non-empty lists")
    if (p < 1).any() or (o < 1).any():
        raise ValueError("every prompt and output length must be >= 1 token")
    return Lengths(p, o)


@dataclass(frozen=True)
class Dist:
    """A discrete distribution: values with weights summing to 1."""
    values: np.ndarray = field(compare=False)
    weights: np.ndarray = field(compare=False)

    def mean(self) -> float:
        return float(self.values @ self.weights)

    def quantiles(self, qs: Any) -> np.ndarray:
        """Inverse CDF: the smallest value whose cumulative weight reaches each q."""
        order = np.argsort(self.values, kind="stable")
        cum = np.cumsum(self.weights[order])
        idx = np.minimum(np.searchsorted(cum, np.asarray(qs, float) - 1e-12), len(cum) - 1)
        return self.values[order][idx]

    def quantile(self, q: float) -> float:
        return float(self.quantiles([q])[0])

    def exceed(self, x: float) -> float:
        return float(self.weights[self.values > x].sum())


def _poisson_pmf(q: float, k_max: int) -> np.ndarray:
    ks = np.arange(k_max + 1)
    return np.exp(-q + ks * math.log(q) - np.array([math.lgamma(k + 1) for k in ks])) if q > 0 else (ks == 0) * 1.0


def gap_distribution(sm: StepModel, running: int, ctx: float, lens: Lengths, budget: int, draws: int = 256,
                     seed: int = 0) -> Dist:
    """Step time seen by a decoding request: the decode step at `running` sequences plus k ~ Poisson(q) prompts
    of the other requests merged into it (Sarathi-Serve hybrid batches), q = (running - 1) / E[O]."""
    q = (running - 1) / lens.output_mean
    k_max = 0 if q == 0 else math.ceil(q + 5 * math.sqrt(q) + 5)     # the Poisson tail beyond is < 1e-5
    pmf = _poisson_pmf(q, k_max)
    pmf = pmf / pmf.sum()
    values, weights = [np.atleast_1d(sm.step_s(running, ctx))], [pmf[:1]]
    rng = np.random.default_rng(seed)
    room = max(budget - running, 1)
    for k in range(1, k_max + 1):
        p = rng.choice(lens.prompts, size=(draws, k))
        tokens, pairs = p.sum(axis=1), (p * (p + 1) / 2).sum(axis=1)
        cut = np.minimum(1.0, room / tokens)        # the token budget carries the rest to the next step
        values.append(sm.step_s(running, ctx, tokens * cut, pairs * cut))
        weights.append(np.full(draws, pmf[k] / draws))
    return Dist(np.concatenate(values), np.concatenate(weights))


def inflight_grid(steps: Dist, n: int = 64) -> np.ndarray:
    """n equally likely values of W, the step a new request waits out before its own: in a closed loop it is
    sent when another request finishes, and the engine has launched its next step by then (vLLM schedules
    the next step as soon as one ends), so W is a whole step of the mixture (quantiles at n bin midpoints)."""
    return steps.quantiles((np.arange(n) + 0.5) / n)


def own_prefill_s(sm: StepModel, decodes: int, ctx: float, prompts: np.ndarray, budget: int) -> np.ndarray:
    """Time of the step(s) that carry each prompt: chunks of budget - decodes tokens, one per step, each
    attending to the chunks before it (Agrawal et al. 2024 sec. 4.2)."""
    chunk = max(budget - decodes, 1)
    total = np.zeros_like(prompts)
    for j in range(int(math.ceil(prompts.max() / chunk))):
        done = np.minimum(prompts, j * chunk)
        c = np.clip(prompts - done, 0, chunk)
        step = sm.step_s(decodes, ctx, c, c * done + c * (c + 1) / 2)
        total = total + np.where(c > 0, step, 0.0)
    return total


def judged_gap_ok(n_gaps: np.ndarray, p_exceed: float, quantile: float) -> np.ndarray:
    """P(a request's `quantile` gap (numpy "higher") <= the SLO) when each of its n gaps exceeds it
    independently with p_exceed: at most n - ceil(quantile(n-1)) - 1 of them may."""
    n = np.maximum(np.asarray(n_gaps, dtype=int), 0)
    allowed = n - np.ceil(quantile * np.maximum(n - 1, 0)).astype(int) - 1
    if p_exceed <= 0 or p_exceed >= 1:
        return np.where(n == 0, 1.0, 1.0 if p_exceed <= 0 else (allowed >= n) * 1.0)
    term = (1 - p_exceed) ** n.astype(float)            # P(count = 0), then P(count = j+1) from P(count = j)
    out = np.where(allowed >= 0, term, 0.0)
    for j in range(int(allowed.max(initial=0))):
        term = term * (n - j) / (j + 1) * p_exceed / (1 - p_exceed)
        out = out + np.where(allowed >= j + 1, term, 0.0)
    return np.where(n == 0, 1.0, out)


@dataclass(frozen=True)
class Steady:
    figures: RowFigures
    queue_s: float              # wait for a free KV slot
    request_rate_rps: float


def steady_state(sm: StepModel, key: RowKey, lens: Lengths, slo: SLO, b: int, budget: int,
                 request_overhead_s: float) -> Steady:
    """The steady-state figures at b running sequences (the equations of the module doc)."""
    ctx = lens.context_mean
    gaps = gap_distribution(sm, b, ctx, lens, budget)
    own = own_prefill_s(sm, b - 1, ctx, lens.prompts, budget) + request_overhead_s    # (n,)
    wait = inflight_grid(gaps) if b > 1 else np.zeros(1)               # (64,): the engine is idle at b = 1
    itl_mean, o_mean = gaps.mean(), lens.output_mean
    rate = b / (own.mean() + wait.mean() + (o_mean - 1) * itl_mean)
    queue = (key.batch - b) / rate
    ttft = queue + own[:, None] + wait[None, :]                        # (n, 64) equally likely
    throughput = key.batch * o_mean / (ttft.mean() + (o_mean - 1) * itl_mean)
    ok = (ttft <= slo.ttft_s).mean(axis=1) * judged_gap_ok(lens.outputs - 1, gaps.exceed(slo.itl_s),
                                                            slo.itl_quantile)
    p50, p99 = np.percentile(ttft, [50, 99])
    share = float(ok.mean())
    figures = RowFigures(*(float(x) for x in (
        throughput, p50 * 1e3, p99 * 1e3, gaps.quantile(0.5) * 1e3, gaps.quantile(0.99) * 1e3, share, share * rate,
        key.tp / (throughput * 3600) * 1e6)))
    return Steady(figures, queue, rate)
