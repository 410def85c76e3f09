"""Goodput of one serving instance in each role (colocated, prefill-only, decode-only), and of P:D layouts.

Goodput (the metric of DistServe, Zhong et al. 2024) is the highest request rate an instance sustains with its
SLOs met. Per instance of tp GPUs, at Poisson rate lambda:

  disaggregated prefill: M/G/1 (DistServe's prefill analysis, sec. 3.1, uses M/D/1); TTFT p90 = wait p90 + service p90 + the
      KV-cache transfer to the decode instance (Splitwise, Patel et al. 2024).
  disaggregated decode: continuous batching; B running requests by Little's law, B = lambda·E[O]·TPOT,
      with TPOT = t_step(B) (servemodel.decode_step_s), solved for the smallest fixed point; KV of B
      requests must fit in memory.
  colocated: prefills run first and stall decoding (DistServe sec. 2, "prefill-decoding interference"),
      so decoding gets 1 - rho_p of the time: TPOT = t_step(B)/(1 - rho_p); a prefill waits for the running
      decode step (non-preemptive priority, queueing.priority_wait_s).

A P:D layout of P prefill and D decode instances serves min(P·lambda_p, D·lambda_d) on (P+D)·tp GPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from scalelab.calc.queueing import mg1_wait_s, priority_wait_s, wait_quantile_s
from scalelab.calc.servemodel import ServeSetup, decode_step_s, kv_transfer_s, prefill_time_s
from scalelab.calc.workload import Workload


@dataclass(frozen=True)
class WorkloadStats:
    prompt_mean: float
    prompt_p90: float
    output_mean: float
    context_mean: float         # KV tokens of a running request, averaged over its output tokens
    prefill_mean_s: float       # E[S]
    prefill_m2_s2: float        # E[S²]
    prefill_p90_s: float
    transfer_p90_s: float       # KV transfer of a p90 prompt over the chosen link
    max_batch: float            # running requests whose KV fits an instance


def workload_stats(ss: ServeSetup, w: Workload, link: str) -> WorkloadStats:
    prompts = w.prompt.points()
    times = [prefill_time_s(ss, p) for p in prompts]
    o1, o2 = w.output.moment(1), w.output.moment(2)
    # token-weighted mean context: E[P] + E[O²]/(2E[O]) for independent P and O
    ctx = w.prompt.moment(1) + o2 / (2 * o1)
    p90 = w.prompt.quantile(0.9)
    return WorkloadStats(w.prompt.moment(1), p90, o1, ctx, sum(times) / len(times),
                         sum(t * t for t in times) / len(times), sorted(times)[int(0.9 * len(times))],
                         kv_transfer_s(ss, p90, link), max(ss.kv_budget_bytes, 0.0) / (ctx * ss.kv_per_token_bytes))


def decode_batch(step: Callable[[float], float], rate: float, output_mean: float, slowdown: float,
                 max_batch: float) -> float:
    """Smallest B with B = rate·E[O]·step(B)·slowdown in [0, max_batch]; inf if none."""
    if max_batch <= 0:
        return math.inf
    g = lambda b: rate * output_mean * step(b) * slowdown - b      # noqa: E731  (> 0 at b = 0)
    grid = [max_batch * i / 128 for i in range(1, 129)]
    hi = next((b for b in grid if g(b) <= 0), None)
    if hi is None:
        return math.inf
    lo = hi - max_batch / 128
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if g(mid) <= 0 else (mid, hi)
    return hi


@dataclass(frozen=True)
class InstanceState:
    rate_rps: float
    ttft_p90_s: float
    tpot_s: float
    batch: float
    ok: bool


def _step(ss: ServeSetup, st: WorkloadStats) -> Callable[[float], float]:
    return lambda b: decode_step_s(ss, b, st.context_mean)


def colocated_state(ss: ServeSetup, st: WorkloadStats, w: Workload, rate: float) -> InstanceState:
    rho = rate * st.prefill_mean_s
    if rho >= 1:
        return InstanceState(rate, math.inf, math.inf, math.inf, False)
    step = _step(ss, st)
    b = decode_batch(step, rate, st.output_mean, 1 / (1 - rho), st.max_batch)
    if math.isinf(b):
        return InstanceState(rate, math.inf, math.inf, b, False)
    t = step(b)
    wait = priority_wait_s(rate, st.prefill_mean_s, st.prefill_m2_s2, (1 - rho) * t / 2)
    ttft = wait_quantile_s(wait, min(1.0, rho + (1 - rho) * min(1.0, b))) + st.prefill_p90_s
    tpot = t / (1 - rho)
    return InstanceState(rate, ttft, tpot, b, ttft <= w.ttft_slo_s and tpot <= w.tpot_slo_s)


def prefill_state(ss: ServeSetup, st: WorkloadStats, w: Workload, rate: float) -> InstanceState:
    wait = mg1_wait_s(rate, st.prefill_mean_s, st.prefill_m2_s2)
    ttft = wait_quantile_s(wait, rate * st.prefill_mean_s) + st.prefill_p90_s + st.transfer_p90_s
    return InstanceState(rate, ttft, 0.0, 0.0, ttft <= w.ttft_slo_s)


def decode_state(ss: ServeSetup, st: WorkloadStats, w: Workload, rate: float) -> InstanceState:
    step = _step(ss, st)
    b = decode_batch(step, rate, st.output_mean, 1.0, st.max_batch)
    tpot = math.inf if math.isinf(b) else step(b)
    return InstanceState(rate, 0.0, tpot, b, tpot <= w.tpot_slo_s)


def max_rate(state: Callable[[float], InstanceState], hi: float) -> float:
    """Largest rate in (0, hi) whose state meets the SLOs (feasibility assumed monotone); 0 if none."""
    lo = 0.0
    if not state(hi * 1e-6).ok:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if state(mid).ok else (lo, mid)
    return lo



@dataclass(frozen=True)
class Capacities:
    """Goodput of one instance (requests/s with SLOs met) in each role."""
    colocated_rps: float
    prefill_rps: float
    decode_rps: float
    colocated: InstanceState    # states at those rates
    prefill: InstanceState
    decode: InstanceState


def capacities(ss: ServeSetup, w: Workload, st: WorkloadStats) -> Capacities:
    top = max(st.max_batch, 1e-9)
    decode_hi = top / (st.output_mean * decode_step_s(ss, top, st.context_mean))
    prefill_hi = 1 / st.prefill_mean_s
    states = {"colocated": lambda r: colocated_state(ss, st, w, r),
              "prefill": lambda r: prefill_state(ss, st, w, r),
              "decode": lambda r: decode_state(ss, st, w, r)}
    his = {"colocated": min(prefill_hi, decode_hi), "prefill": prefill_hi, "decode": decode_hi}
    rates = {k: max_rate(f, his[k]) for k, f in states.items()}
    return Capacities(rates["colocated"], rates["prefill"], rates["decode"],
                      *(states[k](max(rates[k], 1e-12)) for k in ("colocated", "prefill", "decode")))


@dataclass(frozen=True)
class RatioRow:
    prefill_instances: int
    decode_instances: int
    gpus: int
    goodput_rps: float
    goodput_per_gpu: float
    limited_by: str             # "prefill" or "decode"


def fluid_per_gpu(cap: Capacities, tp: int) -> float:
    """Disaggregated goodput per GPU at the ideal real-valued P:D = lambda_d : lambda_p (a large deployment):
    each request needs 1/lambda_p of a prefill instance and 1/lambda_d of a decode instance."""
    if cap.prefill_rps <= 0 or cap.decode_rps <= 0:
        return 0.0
    return 1.0 / (tp * (1.0 / cap.prefill_rps + 1.0 / cap.decode_rps))


def ratio_rows(cap: Capacities, tp: int, max_instances: int = 8) -> list[RatioRow]:
    """Every P:D in lowest terms with P, D <= max_instances, ordered by P/D."""
    rows = []
    for p in range(1, max_instances + 1):
        for d in range(1, max_instances + 1):
            if math.gcd(p, d) != 1:
                continue
            pre, dec = p * cap.prefill_rps, d * cap.decode_rps
            good = min(pre, dec)
            rows.append(RatioRow(p, d, (p + d) * tp, good, good / ((p + d) * tp), "prefill" if pre <= dec else "decode"))
    return sorted(rows, key=lambda r: r.prefill_instances / r.decode_instances)


@dataclass(frozen=True)
class AtRate:
    rate_rps: float
    colocated_instances: int
    prefill_instances: int
    decode_instances: int
    colocated_gpus: int
    disagg_gpus: int


def gpus_at_rate(cap: Capacities, tp: int, rate: float) -> AtRate:
    n = lambda cap_rps: math.ceil(rate / cap_rps) if cap_rps > 0 else 0     # noqa: E731  (0 = cannot)
    c, p, d = n(cap.colocated_rps), n(cap.prefill_rps), n(cap.decode_rps)
    return AtRate(rate, c, p, d, c * tp, (p + d) * tp if p and d else 0)
