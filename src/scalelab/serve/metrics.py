"""Serving metrics from a list of RequestResult: pure functions, no I/O.

Definitions (all over the measured requests: warm-up requests are dropped first):
- duration: first send -> last completion (send_time_s + e2e_s), failed requests included; an open loop's
  from the run start instead (from_origin: t = 0, one arrival gap before its first send, as `vllm bench
  serve` counts), so n requests span n gaps.
- throughput: successful requests / duration; output tokens (usage) / duration; (prompt + output) / duration.
- TTFT, E2E: per successful request. ITL: every inter-chunk gap of every successful request, pooled.
  TPOT per request = (e2e - ttft) / (output_tokens - 1), for requests with >= 2 output tokens.
- percentiles: numpy's default linear interpolation between order statistics (p of x_(1..n) sits at rank
  1 + p(n-1)); p50 of [0.1, 0.2, 0.3, 0.4] = 0.25. Failed requests never enter a latency percentile.
- goodput: see `meets_slo`; counted over ALL measured requests, so a failure counts against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from scalelab.serve.client import RequestResult


@dataclass(frozen=True)
class SLO:
    ttft_s: float = 2.0
    itl_s: float = 0.100
    itl_quantile: float = 0.99  # which per-request gap is judged; see meets_slo
    attainment: float = 0.90  # share of requests that must meet it for a rate to "meet the SLO"


@dataclass(frozen=True)
class LatencyStats:
    n: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float


@dataclass(frozen=True)
class RunMetrics:
    completed: int
    failed: int
    duration_s: float
    request_throughput_rps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft: LatencyStats
    itl: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    goodput_rps: float
    goodput_share: float  # of all measured requests


def latency_stats(values: Sequence[float]) -> LatencyStats:
    """Mean and p50/p90/p99 (linear interpolation); NaN for no values."""
    if len(values) == 0:
        return LatencyStats(0, math.nan, math.nan, math.nan, math.nan)
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return LatencyStats(len(a), float(a.mean()), float(p50), float(p90), float(p99))


def tpot_s(r: RequestResult) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (output_tokens - 1); None below 2 tokens."""
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) if r.output_tokens >= 2 else None


def judged_gap_s(gaps: Sequence[float], quantile: float) -> float:
    """The gap judged for one request: the `quantile` of its gaps by the "higher" order statistic (rank
    ceil(1 + q(n-1))), so never an interpolated value; with q = 0.99 and n <= 100 gaps this is the max gap.
    0 for a request with no gaps (one output chunk)."""
    if len(gaps) == 0:
        return 0.0
    return float(np.quantile(np.asarray(gaps, dtype=float), quantile, method="higher"))


def request_itl_s(r: RequestResult, quantile: float) -> float:
    """`judged_gap_s` of one request's gaps."""
    return judged_gap_s(r.itl_s, quantile)


def meets_slo(r: RequestResult, slo: SLO) -> bool:
    """A request meets the SLO iff it succeeded, ttft_s <= slo.ttft_s, and its `request_itl_s` (by default
    its 99th-percentile inter-token gap, = its max gap for <= 100 gaps) is <= slo.itl_s."""
    return r.success and r.ttft_s <= slo.ttft_s and request_itl_s(r, slo.itl_quantile) <= slo.itl_s


def measured(results: Sequence[RequestResult]) -> list[RequestResult]:
    return [r for r in results if not r.warmup]


def duration_s(results: Sequence[RequestResult], from_origin: bool = False) -> float:
    """First send (or, from_origin, the run start: send times are relative to it) -> last completion."""
    if not results:
        return 0.0
    start = 0.0 if from_origin else min(r.send_time_s for r in results)
    return max(r.send_time_s + r.e2e_s for r in results) - start


def _per_s(x: float, seconds: float) -> float:
    return x / seconds if seconds > 0 else math.nan


def summarize(results: Sequence[RequestResult], slo: SLO = SLO(), from_origin: bool = False) -> RunMetrics:
    """Every metric of one run; warm-up requests are excluded before anything is counted. from_origin: the
    duration counts from the run start (an open loop: see the module docstring), not from the first send."""
    rs = measured(results)
    ok = [r for r in rs if r.success]
    dur = duration_s(rs, from_origin)
    out_tokens = sum(r.output_tokens for r in ok)
    good = sum(meets_slo(r, slo) for r in rs)
    return RunMetrics(
        completed=len(ok), failed=len(rs) - len(ok), duration_s=dur,
        request_throughput_rps=_per_s(len(ok), dur), output_tokens_per_s=_per_s(out_tokens, dur),
        total_tokens_per_s=_per_s(out_tokens + sum(r.prompt_tokens for r in ok), dur),
        ttft=latency_stats([r.ttft_s for r in ok]),
        itl=latency_stats([g for r in ok for g in r.itl_s]),
        tpot=latency_stats([t for r in ok if (t := tpot_s(r)) is not None]),
        e2e=latency_stats([r.e2e_s for r in ok]),
        goodput_rps=_per_s(good, dur), goodput_share=good / len(rs) if rs else math.nan)


# ---------------------------------------------------------------------------------------------
# cost

@dataclass(frozen=True)
class CostEstimate:
    gpu_hours_per_1m_output_tokens: float
    usd_per_1m_output_tokens: float


def cost_per_1m_output(output_tokens: int, duration_s: float, n_gpus: int, usd_per_gpu_hour: float) -> CostEstimate:
    """GPU-hours per 1M output tokens = n_gpus * duration_h / (output_tokens / 1e6); $ = that * $/GPU-hour."""
    if output_tokens <= 0:
        return CostEstimate(math.inf, math.inf)
    gpu_hours = n_gpus * (duration_s / 3600.0) / (output_tokens / 1e6)
    return CostEstimate(gpu_hours, gpu_hours * usd_per_gpu_hour)


def compare_to_api(usd_per_1m: float, prices: Mapping[str, float]) -> dict[str, float]:
    """{api name: our $/1M divided by its $/1M}: < 1 means self-hosting is cheaper at this load. The API prices
    come from serve.prices (a pinned package's price table), never typed in."""
    return {name: usd_per_1m / price for name, price in prices.items()}


# ---------------------------------------------------------------------------------------------
# repeats


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    std: float  # sample standard deviation (ddof = 1)
    min: float
    max: float


def spread(values: Sequence[float], min_repeats: int = 3) -> Spread:
    """Mean, sample std, min, max of one metric over repeated runs of the same row."""
    if len(values) < min_repeats:
        raise ValueError(f"spread: {len(values)} repeats; need at least {min_repeats}")
    a = np.asarray(values, dtype=float)
    return Spread(len(a), float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0,
                  float(a.min()), float(a.max()))


# ---------------------------------------------------------------------------------------------
# the highest request rate that meets the SLO


VERDICT_RULES = ("median", "all")


@dataclass(frozen=True)
class Probe:
    rate_rps: float
    shares: tuple[float, ...]  # goodput share of each repeat at this rate, in run order
    meets: bool                # the verdict of `rate_meets_slo` on them


@dataclass(frozen=True)
class RateSearch:
    rate_rps: float  # highest probed rate that meets the SLO by `rule`; 0.0 if even `lo` misses
    share_at_rate: float  # the statistic the rule judged there: the median share, or the lowest under "all"
    probes: tuple[Probe, ...]  # in probe order, every repeat's share kept
    rule: str = "median"

    @property
    def lower_bound(self) -> bool:
        """The answer is the highest rate probed and it met the SLO: no rate above it was tried, so the
        highest rate meeting the SLO is at least this (the bracket's top, or the step-up's ceiling, met)."""
        return self.rate_rps > 0 and all(p.rate_rps <= self.rate_rps for p in self.probes)


def verdict_share(shares: Sequence[float], rule: str) -> float:
    """The one number a probe is judged by. "median": the median of its repeats' goodput shares (with 2 repeats
    their mean), so one unlucky repeat cannot sink a rate that meets the SLO on the whole; "all": the lowest
    share, so the rate meets the SLO only if every repeat does (conservative: the found rate falls as repeats
    are added, since each adds a chance to miss)."""
    if rule not in VERDICT_RULES:
        raise ValueError(f"rate search rule {rule!r}; allowed: {', '.join(VERDICT_RULES)}")
    if not shares:
        raise ValueError("rate search: a probe with no repeats")
    return float(np.median(shares)) if rule == "median" else float(min(shares))


def rate_meets_slo(shares: Sequence[float], attainment: float, rule: str) -> bool:
    """A probed rate meets the SLO iff `verdict_share` of its repeats is >= attainment (the 90% of the SLO)."""
    return verdict_share(shares, rule) >= attainment


def find_max_rate(run_at_rate: Callable[[float], float | Sequence[float]], slo: SLO, lo_rps: float, hi_rps: float,
                  rel_tol: float = 0.05, max_probes: int = 12, rule: str = "median",
                  floor_rps: float | None = None, ceiling_rps: float | None = None) -> RateSearch:
    """The highest request rate that meets the SLO, by bisection on log(rate) (midpoint = geometric mean),
    assuming the share falls as the rate rises. `run_at_rate(rate)` runs the load (its repeats) and returns the
    goodput share of each repeat (`summarize(...).goodput_share` at that `slo`), or one share for one run;
    `rate_meets_slo` with `rule` judges them. Stops when hi/lo - 1 <= rel_tol or after max_probes probes.

    A bracket taken from an earlier ladder can be wrong at its low end: the ladder's rung met the SLO on its
    repeats, the search's own repeats there miss (near the knee a 5-15 s window is noisy). With `floor_rps`
    below `lo_rps`, a missing `lo` is not the answer: the search halves the rate (never below the floor) until one
    meets, then bisects between it and the lowest miss. Without a floor, or when the floor misses too, the
    result is 0.0. It can be wrong at its high end too (a ladder run on another host, whose CPU serves a small
    model faster): with `ceiling_rps` above `hi_rps`, a `hi` that meets is not the answer: the search doubles
    the rate (never above the ceiling) until one misses, then bisects. Without a ceiling, or when the ceiling
    meets too, the answer is the highest rate probed, a lower bound (`RateSearch.lower_bound`)."""
    if not 0 < lo_rps < hi_rps:
        raise ValueError(f"find_max_rate: need 0 < lo_rps < hi_rps, got {lo_rps}, {hi_rps}")
    if floor_rps is not None and not 0 < floor_rps <= lo_rps:
        raise ValueError(f"find_max_rate: need 0 < floor_rps <= lo_rps, got {floor_rps}, {lo_rps}")
    if ceiling_rps is not None and ceiling_rps < hi_rps:
        raise ValueError(f"find_max_rate: need ceiling_rps >= hi_rps, got {ceiling_rps}, {hi_rps}")
    verdict_share((1.0,), rule)  # an unknown rule fails before any load is run
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        out = run_at_rate(rate)
        shares = (float(out),) if isinstance(out, (int, float)) else tuple(float(s) for s in out)
        probes.append(Probe(rate, shares, rate_meets_slo(shares, slo.attainment, rule)))
        return probes[-1].meets

    def result(rate: float) -> RateSearch:
        at = next((p for p in probes if p.rate_rps == rate), probes[0])
        return RateSearch(rate, verdict_share(at.shares, rule), tuple(probes), rule)

    good, bad = lo_rps, hi_rps
    if not probe(lo_rps):
        good, bad = _step_down(probe, lo_rps, floor_rps, max_probes - 1)
        if good is None:
            return result(0.0)
    elif probe(hi_rps):
        good, bad = _step_up(probe, hi_rps, ceiling_rps, max_probes - len(probes))
        if bad is None:
            return result(good)
    while bad / good - 1 > rel_tol and len(probes) < max_probes:
        mid = math.sqrt(good * bad)  # geometric: rates worth probing span orders of magnitude
        good, bad = (mid, bad) if probe(mid) else (good, mid)
    return result(good)


def _step_up(probe: Callable[[float], bool], hi_rps: float, ceiling_rps: float | None,
             probes_left: int) -> tuple[float, float | None]:
    """(the highest rate that met, the first that missed) doubling from `hi_rps` up to `ceiling_rps`; (the
    highest that met, None) when none misses within the ceiling or the probes left."""
    good = hi_rps
    while ceiling_rps is not None and good < ceiling_rps and probes_left > 0:
        rate = min(good * 2, ceiling_rps)
        probes_left -= 1
        if not probe(rate):
            return good, rate
        good = rate
    return good, None


def _step_down(probe: Callable[[float], bool], lo_rps: float, floor_rps: float | None,
               probes_left: int) -> tuple[float | None, float]:
    """(the first rate that meets, the lowest that missed) halving from `lo_rps` down to `floor_rps`; (None, the
    lowest miss) when none meets within the floor or the probes left."""
    bad = lo_rps
    while floor_rps is not None and bad > floor_rps and probes_left > 0:
        rate = max(bad / 2, floor_rps)
        probes_left -= 1
        if probe(rate):
            return rate, bad
        bad = rate
    return None, bad
