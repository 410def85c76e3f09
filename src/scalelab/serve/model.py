"""Analytic model of one row of the serving scaling table, written before the sweep measures it.

A row is a closed loop of B concurrent requests (prompt P_i, output O_i tokens) against one engine instance of
tp GPUs doing continuous batching (Yu et al. 2022, Orca; Kwon et al. 2023, vLLM PagedAttention) with chunked
prefill: a new request's prompt is merged into the running decode step (Agrawal et al. 2024, Sarathi-Serve).

One engine step with d decoding sequences of mean context c and a prefill of p tokens (attending to a prior
context of s tokens) takes, on the roofline of Pope et al. 2022 sec. 2 (calc.servemodel):
    t = max(FLOPs / (tp·peak·prefill_eff), bytes / (tp·HBM·hbm_eff)) + all-reduces + overhead(tp)
    FLOPs = d·(2N + a·c) + 2N·p + a·(p·s + p(p+1)/2)      bytes = weights + d·c·kv_bytes_per_token
    all-reduces = 2 per layer of (d + p) x d_model bf16 (Shoeybi et al. 2019), alpha-beta (calc.collectives)
    overhead(tp) = overhead_tp1 + sync_per_extra_rank·(tp - 1): scheduler, sampler, launches, worker sync.
Workload: c = sum_i (P_i·O_i + O_i(O_i-1)/2) / sum_i O_i (token-weighted context of a decoding request).
KV cap: running batch b = min(B, max_num_seqs, KV tokens / c); the other B - b requests queue (vLLM waits
for free blocks), which adds (B - b)/lambda to their TTFT.
Gaps (ITL): a decode step at b sequences, plus the prefills of the others merged into it: k ~ Poisson((b-1)/E[O])
new prompts per step (each request brings one prompt per E[O] steps), their prompts drawn from the workload
(capped at max_num_batched_tokens). ITL p50/p99 = quantiles of that step-time mixture.
TTFT_i = queue wait + W + S_i: W = the step the engine launched just before request i arrived (a closed-loop
request is sent when another finishes, and the engine starts its next step at once), a whole step of the gap
mixture, 0 at B = 1 (the engine is idle); S_i = the step(s) carrying request i's own prompt. At B = 1,
TTFT = prefill + overhead.
Throughput = B·E[O] / (E[TTFT] + (E[O] - 1)·E[ITL]) (Little's law over the closed loop).
Goodput share = mean_i P(TTFT_i <= slo.ttft_s) · P(request i's judged gap <= slo.itl_s), the judged gap being
its 0.99 quantile (serve.metrics.request_itl_s): it misses iff more than n - ceil(0.99(n-1)) - 1 of its
n = O_i - 1 gaps exceed the SLO, a binomial count with the mixture's exceedance probability.
GPU-hours per 1M output tokens = tp / (throughput · 3600) · 1e6.

Those are the steady state of an endless loop. The sweep measures finite runs instead (each repeat starts
B requests at once and ends when the last one drains), so with `requests_per_run` the same step model is run
through that schedule, step by step (simulate_run): the start burst of B prompts queued behind each other in
max_num_batched_tokens chunks, the steady middle, and the drain at a falling batch; figures are averaged over
runs as the sweep averages repeats.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from scalelab.calc.cluster import Cluster, make_cluster
from scalelab.calc.collectives import Link
from scalelab.calc.flops import attention_flops_per_context_token, decode_flops_per_token
from scalelab.calc.models import ModelSpec
from scalelab.calc.servemodel import ServeSetup, tp_comm_s
from scalelab.core.hardware import get_hardware
from scalelab.serve.fit import (
    KV_BYTES, EngineLimits, check_fit, engine_limits, kv_capacity_tokens, kv_replicas,
)
from scalelab.serve.metrics import SLO
from scalelab.serve.rows import Row, RowFigures, RowKey

PRIOR_SOURCE = ("priors: hbm_eff 0.8 and prefill_eff 0.6 as in calc.servemodel.ServeSetup; step overhead 2.0 ms "
                "at TP=1 (assumed: scheduler + sampler + kernel launches under CUDA graphs) + 0.5 ms per extra "
                "rank (assumed: broadcasting each step's schedule to the TP worker processes and their sync); "
                "all-reduce latency = the cluster link's alpha (h200: the alpha-beta fit to eager NCCL calls in "
                "results/h200/nccl_collectives.json, 45 us, which CUDA graphs and vLLM's custom all-reduce may "
                "undercut)")
SCORED_FIGURES = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "goodput_share")
FIT_FIGURES = ("throughput_tok_s", "ttft_p50_ms", "itl_p50_ms")   # the means-like figures the constants set
MIN_BAND = 0.05                                                    # floor of a fitted row's interval
TP_LADDER = (1, 2, 4, 8)                                           # the TPs the model explains beyond the rows


@dataclass(frozen=True)
class ServeCalibration:
    hbm_eff: float = 0.8                    # share of HBM bandwidth a decode step reaches
    prefill_eff: float = 0.6                # share of bf16 peak the step's matmuls reach
    overhead_tp1_s: float = 0.002           # fixed cost of one engine step at TP=1
    sync_per_extra_rank_s: float = 0.0005   # added per extra TP rank
    allreduce_latency_s: float | None = None    # per call; None = the cluster link's alpha
    fitted_on: tuple[str, ...] = ()         # RowKey labels the constants were fitted on; () = priors only
    fit_rel_err: tuple[tuple[str, float], ...] = ()   # (figure, max |pred/meas - 1| over the fitted rows)
    prior_band: float = 0.2                 # +-share on both efficiencies for the priors' interval
    overhead_band: float = 0.5              # +-share on overheads and all-reduce latency for the priors' interval
    source: str = PRIOR_SOURCE

    def step_overhead_s(self, tp: int) -> float:
        return self.overhead_tp1_s + self.sync_per_extra_rank_s * (tp - 1)

    @property
    def fitted(self) -> bool:
        return bool(self.fitted_on)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fitted_on": list(self.fitted_on),
                "fit_rel_err": dict(self.fit_rel_err)}


def calibration_from_dict(d: dict[str, Any]) -> ServeCalibration:
    return ServeCalibration(**{**d, "fitted_on": tuple(d.get("fitted_on", ())),
                               "fit_rel_err": tuple(dict(d.get("fit_rel_err", {})).items())})


# ---------------------------------------------------------------------------------------------
# one engine step


@lru_cache(maxsize=64)
def _cluster(hardware: str, tp: int) -> Cluster:
    return make_cluster(hardware, tp)


def _with_latency(cluster: Cluster, latency_s: float | None) -> Cluster:
    """The cluster with every intra-node collective's alpha replaced (as make_cluster's latency override)."""
    if latency_s is None:
        return cluster
    links = {c: Link(l.bus_bw_bytes_s, latency_s, f"{l.source}; alpha {latency_s * 1e6:.1f} us from the calibration")
             for c, l in cluster.intra.items()}
    return dataclasses.replace(cluster, intra=links, calibrated=False)


@lru_cache(maxsize=256)
def _setup(model: ModelSpec, hardware: str, tp: int, hbm_eff: float, prefill_eff: float, mem_util: float,
           allreduce_latency_s: float | None) -> ServeSetup:
    cluster = _with_latency(_cluster(hardware, tp), allreduce_latency_s)
    # kv_bytes counts every replica of a KV head the instance stores (fit.kv_replicas)
    return ServeSetup(model, cluster, tp, prefill_eff=prefill_eff, hbm_eff=hbm_eff, mem_util=mem_util,
                      kv_bytes=KV_BYTES * kv_replicas(model, tp))


@dataclass(frozen=True)
class StepModel:
    setup: ServeSetup
    overhead_s: float
    two_n: float                # 2N: FLOPs per token through the weights
    attn_flops: float           # a: FLOPs per (query, key) pair over all layers
    flops_per_s: float          # tp x peak x prefill_eff
    bytes_per_s: float          # tp x HBM x hbm_eff
    comm_fixed_s: float         # tp_comm_s is linear in the step's tokens: fixed + per_token x tokens
    comm_per_token_s: float

    def scalar_step_s(self, decodes: int, ctx_sum: float, prefill_tokens: float, prefill_pairs: float) -> float:
        """terms(...).total_s for one step, in plain floats (the schedule simulation calls it once per step);
        ctx_sum = the decoding sequences' contexts added up."""
        flops = decodes * self.two_n + self.attn_flops * (ctx_sum + prefill_pairs) + self.two_n * prefill_tokens
        read = self.setup.weights_bytes + ctx_sum * self.setup.kv_per_token_bytes
        comm = self.comm_fixed_s + self.comm_per_token_s * (decodes + prefill_tokens)
        return max(flops / self.flops_per_s, read / self.bytes_per_s) + comm + self.overhead_s

    def decode_run_s(self, decodes: int, ctx_sum: float, n: int) -> np.ndarray:
        """n consecutive decode-only steps of `decodes` sequences whose contexts grow by one token per step."""
        ctx = ctx_sum + decodes * np.arange(n)
        flops = decodes * self.two_n + self.attn_flops * ctx
        read = self.setup.weights_bytes + ctx * self.setup.kv_per_token_bytes
        comm = self.comm_fixed_s + self.comm_per_token_s * decodes
        return np.maximum(flops / self.flops_per_s, read / self.bytes_per_s) + comm + self.overhead_s

    def terms(self, decodes: Any, ctx: float, prefill_tokens: Any = 0.0, prefill_pairs: Any = 0.0) -> StepTerms:
        """Roofline terms of one step (arrays broadcast); calc.servemodel.decode_step_s and prefill_time_s
        are its two pure cases."""
        ss, hw = self.setup, self.setup.cluster.hardware
        flops = decodes * (self.two_n + self.attn_flops * ctx) + self.two_n * prefill_tokens \
            + self.attn_flops * prefill_pairs
        read = ss.weights_bytes + decodes * ctx * ss.kv_per_token_bytes
        return StepTerms(compute_s=flops / (ss.tp * hw.bf16_flops * ss.prefill_eff),
                         memory_s=read / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff),
                         weights_s=ss.weights_bytes / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff),
                         comm_s=tp_comm_s(ss, decodes + prefill_tokens), overhead_s=self.overhead_s)

    def step_s(self, decodes: Any, ctx: float, prefill_tokens: Any = 0.0, prefill_pairs: Any = 0.0) -> Any:
        return self.terms(decodes, ctx, prefill_tokens, prefill_pairs).total_s


@dataclass(frozen=True)
class StepTerms:
    compute_s: Any
    memory_s: Any
    weights_s: Any              # the weights' share of memory_s
    comm_s: Any
    overhead_s: float

    @property
    def total_s(self) -> Any:
        return np.maximum(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s


def step_model(model: ModelSpec, hardware: str, tp: int, mem_util: float, cal: ServeCalibration) -> StepModel:
    ss = _setup(model, hardware, tp, cal.hbm_eff, cal.prefill_eff, mem_util, cal.allreduce_latency_s)
    hw = ss.cluster.hardware
    fixed = float(tp_comm_s(ss, 0.0))
    return StepModel(ss, cal.step_overhead_s(tp), decode_flops_per_token(model, 0),
                     attention_flops_per_context_token(model), tp * hw.bf16_flops * cal.prefill_eff,
                     tp * hw.hbm_bytes_s * cal.hbm_eff, fixed, float(tp_comm_s(ss, 1.0)) - fixed)


def allreduce_latency_s(model: ModelSpec, hardware: str, tp: int, cal: ServeCalibration) -> float:
    """The per-call all-reduce latency in use: the calibration's, else the cluster link's alpha."""
    if cal.allreduce_latency_s is not None:
        return cal.allreduce_latency_s
    return _cluster(hardware, max(tp, 2)).intra["all_reduce"].latency_s


# ---------------------------------------------------------------------------------------------
# workload and distributions


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


# ---------------------------------------------------------------------------------------------
# a finite closed-loop run, step by step (the sweep's protocol: every run starts with `batch` requests at once)


@dataclass(frozen=True)
class RunTrace:
    ttft_s: np.ndarray          # (n,) per request
    judged_gap_s: np.ndarray    # (n,) each request's slo.itl_quantile gap ("higher"), 0 without gaps
    step_s: np.ndarray          # (steps,) every engine step
    decoders: np.ndarray        # (steps,) gaps each step closed (one per decoding sequence)
    duration_s: float           # first send -> last token
    output_tokens: float


@dataclass
class _Engine:
    """Mutable scheduler state of one simulated run."""
    d: int = 0                  # decoding sequences
    ctx_sum: float = 0.0        # their contexts added up (tokens)
    running: int = 0            # admitted (prefilling + decoding), bounded by the KV cap
    finished: int = 0


def _prefill_chunks(prefilling: list[list[int]], prompts: np.ndarray, room: int) -> tuple[float, float, int]:
    """FCFS chunks for this step (Sarathi-Serve): (tokens, attention pairs, number of prompts completed)."""
    tokens = pairs = 0.0
    completed = 0
    for item in prefilling:
        if room <= 0:
            break
        i, done = item
        c = min(int(prompts[i]) - done, room)
        tokens, pairs = tokens + c, pairs + c * done + c * (c + 1) / 2
        item[1], room = done + c, room - c
        completed += item[1] >= prompts[i]
    return tokens, pairs, completed


def simulate_run(sm: StepModel, prompts: np.ndarray, outputs: np.ndarray, batch: int, max_running: int,
                 budget: int, quantile: float) -> RunTrace:
    """All requests through a closed loop of `batch` clients: the first `batch` arrive at t = 0; each later one
    when another finishes, and (unless the engine is idle) it waits out the step already launched."""
    n = len(prompts)
    arrival, first, start = np.zeros(n), np.zeros(n), np.zeros(n, dtype=int)
    queue, pending, prefilling, finishing = deque(range(min(batch, n))), [], [], []
    nxt, e, t, steps, decs = min(batch, n), _Engine(), 0.0, [], []
    while e.finished < n:
        if e.d and not (prefilling or queue or pending) and finishing[0][0] > len(steps):
            t = _fast_forward(sm, e, finishing[0][0] - len(steps), t, steps, decs)
            continue
        if e.d == 0 and not prefilling and not queue:
            queue.extend(pending)                       # idle engine: nothing in flight to wait for
            pending.clear()
        while queue and e.running < max_running:
            prefilling.append([queue.popleft(), 0])
            e.running += 1
        tokens, pairs, completed = _prefill_chunks(prefilling, prompts, budget - e.d)
        if e.d == 0 and tokens == 0:
            raise RuntimeError("simulate_run: no work and no arrival (max_running < 1?)")
        dt = sm.scalar_step_s(e.d, e.ctx_sum, tokens, pairs)
        t, k = t + dt, len(steps)
        steps.append(dt)
        decs.append(e.d)
        e.ctx_sum += e.d
        queue.extend(pending)                           # arrived during this step: eligible for the next
        pending.clear()
        while finishing and finishing[0][0] == k:
            _, i = heapq.heappop(finishing)
            e.d, e.ctx_sum = e.d - 1, e.ctx_sum - prompts[i] - outputs[i]
            nxt = _finish(e, t, nxt, n, arrival, pending)
        for _ in range(completed):
            i = prefilling.pop(0)[0]
            first[i], start[i] = t, k + 1
            if outputs[i] <= 1:
                nxt = _finish(e, t, nxt, n, arrival, pending)
            else:
                e.d, e.ctx_sum = e.d + 1, e.ctx_sum + prompts[i] + 1
                heapq.heappush(finishing, (k + int(outputs[i]) - 1, i))
    return _trace(np.array(steps), np.array(decs), first - arrival, start, outputs, quantile, t)


def _fast_forward(sm: StepModel, e: _Engine, n: int, t: float, steps: list, decs: list) -> float:
    """n decode-only steps (nothing to prefill, nobody finishing) at once."""
    dts = sm.decode_run_s(e.d, e.ctx_sum, n)
    steps.extend(dts.tolist())
    decs.extend([e.d] * n)
    e.ctx_sum += e.d * n
    return t + float(dts.sum())


def _finish(e: _Engine, t: float, nxt: int, n: int, arrival: np.ndarray, pending: list[int]) -> int:
    """A request ends at t: its client sends the next one at once."""
    e.running, e.finished = e.running - 1, e.finished + 1
    if nxt < n:
        arrival[nxt] = t
        pending.append(nxt)
        nxt += 1
    return nxt


def _trace(steps: np.ndarray, decs: np.ndarray, ttft: np.ndarray, start: np.ndarray, outputs: np.ndarray,
           quantile: float, t: float) -> RunTrace:
    judged = np.zeros(len(ttft))
    for i, (s, o) in enumerate(zip(start, outputs.astype(int))):
        if o >= 2:                                      # its O - 1 gaps are the steps s .. s + O - 2
            rank = math.ceil(quantile * (o - 2))        # numpy's "higher" order statistic of O - 1 gaps
            judged[i] = np.partition(steps[s:s + o - 1], rank)[rank]
    return RunTrace(ttft, judged, steps, decs, t, float(outputs.sum()))


def trace_figures(tr: RunTrace, tp: int, slo: SLO) -> RowFigures:
    """The figures the sweep computes from one repeat (serve.metrics), from a simulated run."""
    gaps = Dist(tr.step_s, tr.decoders / tr.decoders.sum()) if tr.decoders.sum() else Dist(np.zeros(1), np.ones(1))
    good = float(((tr.ttft_s <= slo.ttft_s) & (tr.judged_gap_s <= slo.itl_s)).mean())
    p50, p99 = np.percentile(tr.ttft_s, [50, 99])
    return RowFigures(tr.output_tokens / tr.duration_s, float(p50) * 1e3, float(p99) * 1e3,
                      gaps.quantile(0.5) * 1e3, gaps.quantile(0.99) * 1e3, good,
                      good * len(tr.ttft_s) / tr.duration_s, tp * tr.duration_s / 3600 / (tr.output_tokens / 1e6))


def simulated_figures(sm: StepModel, lens: Lengths, key: RowKey, max_running: int, budget: int, slo: SLO,
                      requests_per_run: int) -> RowFigures:
    """Mean over consecutive runs of `requests_per_run` requests, as the sweep averages its repeats."""
    per_run = []
    for lo in range(0, len(lens.prompts), requests_per_run):
        sl = slice(lo, lo + requests_per_run)
        tr = simulate_run(sm, lens.prompts[sl], lens.outputs[sl], key.batch, max_running, budget, slo.itl_quantile)
        per_run.append(trace_figures(tr, key.tp, slo))
    names = [f.name for f in dataclasses.fields(RowFigures)]
    return RowFigures(*(float(np.mean([getattr(f, n) for f in per_run])) for n in names))


# ---------------------------------------------------------------------------------------------
# one row


@dataclass(frozen=True)
class RowDetail:
    figures: RowFigures
    running: int                # b: sequences decoding together
    max_running: float          # KV tokens / context: the cap on b
    context_tokens: float       # c
    decode: StepTerms           # the decode step at b (scalars)
    prefill_step_share: float   # share of steps carrying another request's prompt
    queue_s: float              # wait for a free KV slot
    request_rate_rps: float
    requests_per_run: int | None = None     # figures from simulated runs of this many requests


def _detail(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
            cal: ServeCalibration, limits: EngineLimits, requests_per_run: int | None = None) -> RowDetail:
    """Steady state (requests_per_run None), or the mean of simulated runs of that many requests."""
    sm = step_model(model, hardware, key.tp, mem_util, cal)
    ctx, budget = lens.context_mean, limits.max_num_batched_tokens
    cap = kv_capacity_tokens(model, hardware, key.tp, mem_util, limits) / ctx
    b = max(1, min(key.batch, limits.max_num_seqs, int(cap)))
    steady = _steady(sm, key, lens, slo, b, budget)
    figures = steady[0] if not requests_per_run else simulated_figures(sm, lens, key, b, budget, slo,
                                                                       requests_per_run)
    q = (b - 1) / lens.output_mean
    return RowDetail(figures, b, cap, ctx, sm.terms(b, ctx), 1 - math.exp(-q), steady[1], steady[2],
                     requests_per_run)


def row_figures(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
                cal: ServeCalibration, limits: EngineLimits, requests_per_run: int | None = None) -> RowFigures:
    """_detail(...).figures without the steady-state analysis a simulated row does not need (for fitting)."""
    if not requests_per_run:
        return _detail(model, hardware, key, lens, slo, mem_util, cal, limits).figures
    sm = step_model(model, hardware, key.tp, mem_util, cal)
    cap = kv_capacity_tokens(model, hardware, key.tp, mem_util, limits) / lens.context_mean
    b = max(1, min(key.batch, limits.max_num_seqs, int(cap)))
    return simulated_figures(sm, lens, key, b, limits.max_num_batched_tokens, slo, requests_per_run)


def _steady(sm: StepModel, key: RowKey, lens: Lengths, slo: SLO, b: int, budget: int
            ) -> tuple[RowFigures, float, float]:
    """The steady-state figures, the KV-queue wait and the request rate (the equations of the module doc)."""
    ctx = lens.context_mean
    gaps = gap_distribution(sm, b, ctx, lens, budget)
    own = own_prefill_s(sm, b - 1, ctx, lens.prompts, budget)          # (n,)
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
    return figures, queue, rate


def regime_note(d: RowDetail, key: RowKey) -> str:
    t = d.decode
    total = float(t.total_s)
    bound = "memory-bound" if t.memory_s >= t.compute_s else "compute-bound"
    parts = [f"decode {bound}: weights {t.weights_s / t.memory_s:.0%} of step bytes",
             f"all-reduce {t.comm_s / total:.0%} of step", f"fixed overhead {t.overhead_s / total:.0%} of step",
             f"decode step {total * 1e3:.2f} ms at {d.running} running",
             f"{d.prefill_step_share:.0%} of steps carry another request's prefill"]
    if d.running < key.batch:
        parts.append(f"KV cache holds {d.max_running:.0f} requests of {d.context_tokens:.0f} tokens: "
                     f"{key.batch - d.running} queue, adding {d.queue_s * 1e3:.0f} ms to TTFT")
    if d.requests_per_run:
        parts.append(f"figures: mean of simulated runs of {d.requests_per_run} requests, each starting with "
                     f"{min(key.batch, d.requests_per_run)} prompts at once and ending with a drain")
    return "; ".join(parts)


def resolved(cal: ServeCalibration, model: ModelSpec, hardware: str, tp: int) -> ServeCalibration:
    """The calibration with the all-reduce latency it implies written out."""
    return dataclasses.replace(cal, allreduce_latency_s=allreduce_latency_s(model, hardware, tp, cal))


def corner(cal: ServeCalibration, sign: int) -> ServeCalibration:
    """sign +1: faster (efficiencies up by prior_band, fixed costs down by overhead_band); -1: slower."""
    e, o = 1 + sign * cal.prior_band, 1 - sign * cal.overhead_band
    return dataclasses.replace(cal, hbm_eff=min(1.0, cal.hbm_eff * e), prefill_eff=min(1.0, cal.prefill_eff * e),
                               overhead_tp1_s=cal.overhead_tp1_s * o,
                               sync_per_extra_rank_s=cal.sync_per_extra_rank_s * o,
                               allreduce_latency_s=cal.allreduce_latency_s * o)


def _bounds(name: str, lo: float, hi: float) -> dict[str, float]:
    if name == "goodput_share":
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return {"lo": float(lo), "hi": float(hi)}


def interval(central: RowFigures, evaluate: Any, cal: ServeCalibration) -> tuple[dict[str, dict[str, float]], str]:
    """Per-figure {"lo", "hi"} and how they were derived. `evaluate(cal) -> RowFigures`."""
    names = [f.name for f in dataclasses.fields(RowFigures)]
    if cal.fitted:
        err = dict(cal.fit_rel_err)
        band = {n: max(err.get(n, MIN_BAND), MIN_BAND) for n in names}
        out = {n: _bounds(n, getattr(central, n) * (1 - band[n]), getattr(central, n) * (1 + band[n])) for n in names}
        return out, (f"+- the model's largest relative error on the {len(cal.fitted_on)} fitted rows, figure by "
                     f"figure (at least {MIN_BAND:.0%}; figures not scored there get {MIN_BAND:.0%})")
    sides = [central, evaluate(corner(cal, +1)), evaluate(corner(cal, -1))]
    out = {n: _bounds(n, min(getattr(s, n) for s in sides), max(getattr(s, n) for s in sides)) for n in names}
    return out, (f"range over the priors and two corners: efficiencies x(1 +- {cal.prior_band:.0%}) with step "
                 f"overheads and all-reduce latency x(1 -+ {cal.overhead_band:.0%})")


def _lengths_sample(lens: Lengths, n: int = 20_000) -> list[list[int]]:
    """The (prompt, output) pairs in request order (order matters to simulated runs), or n of them spread over
    the prompt order for a very long workload: enough to re-run the model from a report."""
    if len(lens.prompts) <= n:
        return [[int(p), int(o)] for p, o in zip(lens.prompts, lens.outputs)]
    order = np.argsort(lens.prompts, kind="stable")
    pick = order[np.linspace(0, len(order) - 1, min(n, len(order))).round().astype(int)]
    return [[int(lens.prompts[i]), int(lens.outputs[i])] for i in pick]


def _provenance(model: ModelSpec, hardware: str, lens: Lengths, slo: SLO, mem_util: float, usd: float,
                cal: ServeCalibration, limits: EngineLimits, requests_per_run: int | None) -> dict[str, Any]:
    return {"source": "scalelab.serve.model", "model_spec": dataclasses.asdict(model), "hardware": hardware,
            "mem_util": mem_util, "usd_per_gpu_hour": usd, "slo": dataclasses.asdict(slo),
            "limits": dataclasses.asdict(limits), "calibration": cal.to_dict(),
            "workload": {"requests": int(lens.prompts.size), "prompt_mean": float(lens.prompts.mean()),
                         "output_mean": lens.output_mean, "context_mean": lens.context_mean,
                         "requests_per_run": requests_per_run, "lengths": _lengths_sample(lens)}}


def predict_row(model: ModelSpec, hardware: str, key: RowKey, prompt_tokens: Sequence[int],
                output_tokens: Sequence[int], slo: SLO, mem_util: float, usd_per_gpu_hour: float,
                calibration: ServeCalibration | None = None, limits: EngineLimits | None = None,
                requests_per_run: int | None = None) -> Row:
    """The predicted row (status "predicted"), or "wont_fit" with the reason in the note. requests_per_run:
    None = the steady state of an endless closed loop; N = the lengths are consecutive runs of N requests
    (the sweep's repeats), each simulated from its start burst to its drain, and the figures averaged."""
    limits = limits or engine_limits(key.engine)
    lens = lengths(prompt_tokens, output_tokens)
    cal = resolved(calibration or ServeCalibration(), model, hardware, key.tp)
    prov = _provenance(model, hardware, lens, slo, mem_util, usd_per_gpu_hour, cal, limits, requests_per_run)
    fit = check_fit(model, hardware, key.tp, mem_util, int((lens.prompts + lens.outputs).max()), limits)
    prov["fit_check"] = fit.reason
    if not fit.fits:
        return Row(key, "wont_fit", RowFigures.nan(), {}, fit.reason, prov)
    d = _detail(model, hardware, key, lens, slo, mem_util, cal, limits, requests_per_run)
    spread, how = interval(d.figures, lambda c: row_figures(model, hardware, key, lens, slo, mem_util, c, limits,
                                                            requests_per_run), cal)
    prov["interval"] = how
    prov["usd_per_1m_output"] = d.figures.gpu_hours_per_1m * usd_per_gpu_hour
    return Row(key, "predicted", d.figures, spread, regime_note(d, key), prov)


def predict_rows(model: ModelSpec, hardware: str, keys: Sequence[RowKey], prompt_tokens: Sequence[int],
                 output_tokens: Sequence[int], slo: SLO, mem_util: float, usd_per_gpu_hour: float,
                 calibration: ServeCalibration | None = None, requests_per_run: int | None = None) -> list[Row]:
    return [predict_row(model, hardware, k, prompt_tokens, output_tokens, slo, mem_util, usd_per_gpu_hour,
                        calibration, requests_per_run=requests_per_run) for k in keys]


# ---------------------------------------------------------------------------------------------
# calibration on measured rows


def default_fit_labels(rows: Sequence[Row]) -> tuple[str, ...]:
    """The rows the constants are fitted on: the smallest batch of every TP (it pins that TP's fixed per-step
    cost: overhead and all-reduce latency) and the largest batch of the smallest TP (the batch slope pins the
    efficiencies). Every other measured row is held out for scoring."""
    keys = [r.key for r in rows if r.status == "ok"]
    chosen: set[RowKey] = set()
    for engine in {k.engine for k in keys}:
        mine = [k for k in keys if k.engine == engine]
        smallest = {min((k for k in mine if k.tp == tp), key=lambda k: k.batch) for tp in {k.tp for k in mine}}
        low = min(k.tp for k in mine)
        slope = max((k for k in mine if k.tp == low), key=lambda k: k.batch)
        # keep at least one row of the engine out of the fit when there are two or more
        chosen |= smallest | ({slope} if len(smallest | {slope}) < len(mine) else set())
    return tuple(k.label for k in sorted(chosen, key=lambda k: (k.engine, k.tp, k.batch)))


# fitted constants and their transforms to an unbounded space: efficiencies by logit, times by log
_TRANSFORMS = {
    "hbm_eff": (lambda v: math.log(v / (1 - v)), lambda x: 1 / (1 + math.exp(-x))),
    "prefill_eff": (lambda v: math.log(v / (1 - v)), lambda x: 1 / (1 + math.exp(-x))),
    "overhead_tp1_s": (math.log, math.exp),
    "allreduce_latency_s": (math.log, math.exp),
}
REG_WEIGHT = 0.001  # pull toward the priors, per unit of transformed parameter; keeps ill-posed fits finite


def _free_params(rows: Sequence[Row]) -> list[str]:
    """The all-reduce latency is told apart from the overhead only by rows at TP=1 and at TP>1 together."""
    tps = {r.key.tp for r in rows}
    return ["hbm_eff", "prefill_eff", "overhead_tp1_s"] + (["allreduce_latency_s"] if 1 in tps and len(tps) > 1 else [])


def _apply(cal: ServeCalibration, names: list[str], theta: np.ndarray) -> ServeCalibration:
    return dataclasses.replace(cal, **{n: _TRANSFORMS[n][1](float(x)) for n, x in zip(names, theta)})


def _log_errors(pred: RowFigures, meas: RowFigures, figures: Sequence[str]) -> list[float]:
    out = []
    for f in figures:
        p, m = getattr(pred, f), getattr(meas, f)
        if math.isfinite(p) and math.isfinite(m) and p > 0 and m > 0:
            out.append(math.log(p / m))
    return out


def levenberg_marquardt(residual: Any, theta0: np.ndarray, max_iter: int = 40, tol: float = 1e-7) -> np.ndarray:
    """Minimise |residual(theta)|^2 (Marquardt 1963) with a forward-difference Jacobian."""
    theta, r = theta0.astype(float), residual(theta0)
    mu, h = 1e-3, 1e-6
    for _ in range(max_iter):
        jac = np.stack([(residual(theta + h * e) - r) / h for e in np.eye(len(theta))], axis=1)
        a, g = jac.T @ jac, jac.T @ r
        while mu < 1e10:
            step = np.linalg.solve(a + mu * (np.diag(np.diag(a)) + 1e-12 * np.eye(len(theta))), -g)
            r_new = residual(theta + step)
            if r_new @ r_new < r @ r:
                break
            mu *= 4
        else:
            return theta
        gain = r @ r - r_new @ r_new
        theta, r, mu = theta + step, r_new, max(mu / 3, 1e-9)
        if gain < tol * (r @ r) + 1e-16 or np.abs(step).max() < 1e-7:   # relative: noisy rows stop early
            break
    return theta


@dataclass(frozen=True)
class RowWorkload:
    """The requests one row was measured with (the sweep gives every row its own slice of the pool)."""
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    requests_per_run: int | None = None


def _fit_rows(measured: Sequence[Row], fit_on: Sequence[str] | None) -> list[Row]:
    ok = [r for r in measured if r.status == "ok"]
    labels = tuple(fit_on) if fit_on is not None else default_fit_labels(ok)
    rows = [r for r in ok if r.key.label in labels]
    missing = set(labels) - {r.key.label for r in rows}
    if missing or not rows:
        raise ValueError(f"fit_calibration: no measured 'ok' row for {sorted(missing) or 'any label'}; "
                         f"measured ok rows: {[r.key.label for r in ok]}")
    if len({r.key.engine for r in rows}) > 1:
        raise ValueError(f"fit_calibration: rows of several engines {sorted({r.key.engine for r in rows})}; "
                         "fit one calibration per engine")
    return rows


def fit_calibration(measured: Sequence[Row], model: ModelSpec, hardware: str, prompt_tokens: Sequence[int],
                    output_tokens: Sequence[int], slo: SLO = SLO(), mem_util: float = 0.9,
                    fit_on: Sequence[str] | None = None, prior: ServeCalibration | None = None,
                    workloads: dict[str, RowWorkload] | None = None) -> ServeCalibration:
    """Fit hbm_eff, prefill_eff, the TP=1 step overhead and (given TP=1 and TP>1 rows) the all-reduce latency
    to the measured throughput, p50 TTFT and p50 ITL of the `fit_on` rows (default: default_fit_labels), by
    least squares on log(predicted / measured). Each row is predicted on `workloads[label]` when given, else on
    prompt_tokens/output_tokens in steady state. The per-rank sync stays at its prior: within one model it
    cannot be told apart from the all-reduce latency."""
    rows = _fit_rows(measured, fit_on)
    base = resolved(prior or ServeCalibration(), model, hardware, min(r.key.tp for r in rows))
    names, limits = _free_params(rows), engine_limits(rows[0].key.engine)
    theta0 = np.array([_TRANSFORMS[n][0](getattr(base, n)) for n in names])
    default = RowWorkload(tuple(prompt_tokens), tuple(output_tokens))
    work = {r.key: (workloads or {}).get(r.key.label, default) for r in rows}
    lens = {k: lengths(w.prompt_tokens, w.output_tokens) for k, w in work.items()}

    def predict(cal: ServeCalibration, key: RowKey) -> RowFigures:
        return row_figures(model, hardware, key, lens[key], slo, mem_util, cal, limits, work[key].requests_per_run)

    def residual(theta: np.ndarray) -> np.ndarray:
        cal = _apply(base, names, theta)
        errs = [e for r in rows for e in _log_errors(predict(cal, r.key), r.figures, FIT_FIGURES)]
        return np.array(errs + list(REG_WEIGHT * (theta - theta0)))

    fitted = _apply(base, names, levenberg_marquardt(residual, theta0))
    worst = {f: max(abs(getattr(predict(fitted, r.key), f) / getattr(r.figures, f) - 1) for r in rows)
             for f in SCORED_FIGURES if all(getattr(r.figures, f) > 0 for r in rows)}
    return dataclasses.replace(
        fitted, fitted_on=tuple(r.key.label for r in rows), fit_rel_err=tuple(worst.items()),
        source=f"fitted ({', '.join(names)}) on {len(rows)} measured rows to {', '.join(FIT_FIGURES)}; "
               f"sync per extra rank kept at {fitted.sync_per_extra_rank_s * 1e3:.2f} ms; start: {base.source}")


# ---------------------------------------------------------------------------------------------
# explaining the table


def best_rows(rows: Sequence[Row]) -> dict[RowKey, Row]:
    """Per key, the measured row if it succeeded, else the prediction; failed and wont_fit rows left out."""
    out: dict[RowKey, Row] = {}
    for r in rows:
        if r.key.batch < 1 or r.provenance.get("load", {}).get("mode") == "rate":
            continue                            # open-loop rows have no concurrency to scale along
        if r.status == "ok" or (r.status == "predicted" and r.key not in out):
            out[r.key] = r
    return out


def _src(r: Row) -> str:
    return "measured" if r.status == "ok" else "predicted"


def _gain(base: Row, top: Row) -> float:
    return top.figures.throughput_tok_s / base.figures.throughput_tok_s


def _ratio_sentence(base: Row, top: Row, predicted: dict[RowKey, Row]) -> str:
    b, t = base.figures, top.figures
    gain, linear = _gain(base, top), top.key.tp / base.key.tp
    pb, pt = predicted.get(base.key), predicted.get(top.key)
    model = (f" (the model predicted {_gain(pb, pt):.2f}x)" if pb and pt and (pb, pt) != (base, top)
             and "ok" in (base.status, top.status) else "")
    return (f"At batch {top.key.batch}, TP={top.key.tp} gives {gain:.2f}x the output tokens/s of TP={base.key.tp} "
            f"({t.throughput_tok_s:,.0f} vs {b.throughput_tok_s:,.0f} tok/s, {_src(top)} vs {_src(base)}){model}: "
            f"{gain / linear:.0%} of linear, so 1M output tokens take {t.gpu_hours_per_1m / b.gpu_hours_per_1m:.2f}x "
            f"the GPU-hours ({t.gpu_hours_per_1m:.3g} vs {b.gpu_hours_per_1m:.3g}).")


def wont_fit_sentences(rows: Sequence[Row]) -> list[str]:
    measured_ok = {r.key for r in rows if r.status == "ok"}
    seen: dict[tuple[str, int], str] = {}
    for r in rows:
        if r.status == "wont_fit" and r.key not in measured_ok:
            seen.setdefault((r.key.engine, r.key.tp), r.note)
    return [f"{engine} TP={tp} does not fit at any batch: {note}" for (engine, tp), note in sorted(seen.items())]


def tp_ratio_sentences(rows: Sequence[Row]) -> list[str]:
    """Throughput and GPU-hours of each TP against the smallest TP at the same batch (and the model's ratio)."""
    best = best_rows(rows)
    predicted = {r.key: r for r in rows if r.status == "predicted"}
    out = []
    for engine in sorted({k.engine for k in best}):
        for batch in sorted({k.batch for k in best if k.engine == engine}):
            same = sorted((r for k, r in best.items() if k.engine == engine and k.batch == batch),
                          key=lambda r: r.key.tp)
            out += [_ratio_sentence(same[0], r, predicted) for r in same[1:]]
    return out


def gemm_intensity(m: float, k: float, n: float) -> float:
    """FLOPs per byte of an (m x k) @ (k x n) bf16 GEMM reading both inputs and writing the output once."""
    return 2 * m * k * n / (2 * (m * k + k * n + m * n))


def _terms(model: ModelSpec, hardware: str, tp: int, mem_util: float, cal: ServeCalibration, decodes: float,
           ctx: float, prompt: float = 0.0) -> StepTerms:
    sm = step_model(model, hardware, tp, mem_util, resolved(cal, model, hardware, tp))
    return sm.terms(decodes, ctx, prompt, prompt * (prompt + 1) / 2)


def decode_sentence(model: ModelSpec, hardware: str, tps: Sequence[int], ctx: float, mem_util: float,
                    cal: ServeCalibration) -> str:
    parts, shares = [], []
    for tp in tps:
        t = _terms(model, hardware, tp, mem_util, cal, 1, ctx)
        shares.append(float((t.comm_s + t.overhead_s) / t.total_s))
        parts.append(f"TP={tp}: weights {float(t.weights_s) * 1e3:.2f} ms + all-reduce {float(t.comm_s) * 1e3:.2f} ms"
                     f" + overhead {t.overhead_s * 1e3:.2f} ms ({shares[-1]:.0%} fixed)")
    lat = allreduce_latency_s(model, hardware, max(tps), cal)
    return (f"Model, batch-1 decode step of {model.name} ({ctx:.0f}-token context): {'; '.join(parts)}. Each GPU's "
            f"weight read shrinks as 1/TP, while the {2 * model.n_layers} all-reduces per step (2 per layer, "
            f"Shoeybi et al. 2019; {lat * 1e6:.1f} us latency each) and the step overhead do not shrink, so the fixed "
            f"share "
            f"goes from {shares[0]:.0%} at TP={tps[0]} to {shares[-1]:.0%} at TP={tps[-1]}.")


def intensity_sentence(model: ModelSpec, hardware: str, tps: Sequence[int], batch: int) -> str:
    hw = get_hardware(hardware)
    ridge = hw.bf16_flops / hw.hbm_bytes_s
    ai = [gemm_intensity(batch, model.d_model, model.d_ff / tp) for tp in tps]
    listed = ", ".join(f"{a:.1f} at TP={tp}" for a, tp in zip(ai, tps))
    regime = ("below" if max(ai) < ridge else "above") + f" the {hw.name} ridge of {ridge:.0f} FLOP/B"
    return (f"Per GPU, the batch-{batch} decode MLP GEMMs run at {listed} FLOP/B ({ai[-1] / ai[0] - 1:+.1%} from "
            f"TP={tps[0]} to TP={tps[-1]}), {regime}: splitting the weights divides the bytes per GPU by TP while "
            f"the FLOPs per byte stay near the batch size, so each GPU's step shrinks toward the fixed costs.")


def prefill_sentence(model: ModelSpec, hardware: str, tps: Sequence[int], prompt: float, mem_util: float,
                     cal: ServeCalibration) -> str:
    parts = []
    for tp in tps:
        t = _terms(model, hardware, tp, mem_util, cal, 0, 0.0, prompt)
        work = "compute" if t.compute_s >= t.memory_s else "weight reads"
        parts.append(f"TP={tp}: {work} {float(max(t.compute_s, t.memory_s)) * 1e3:.1f} ms + all-reduce "
                     f"{float(t.comm_s) * 1e3:.1f} ms")
    return (f"Model, prefill of a {prompt:.0f}-token prompt: {'; '.join(parts)}: the prompt's FLOPs split over the "
            f"GPUs, its {2 * model.n_layers} all-reduces of {prompt:.0f} x {model.d_model} activations do not.")


def mechanism_sentences(model: ModelSpec, hardware: str, tps: Sequence[int], ctx: float, prompt: float,
                        batch: int, mem_util: float, cal: ServeCalibration) -> list[str]:
    """Why TP stops paying, from the model's step decomposition at the TPs where the model fits."""
    tps = sorted(t for t in set(tps) if check_fit(model, hardware, t, mem_util, int(ctx)).fits)
    if len(tps) < 2:
        return []
    return [decode_sentence(model, hardware, tps, ctx, mem_util, cal), intensity_sentence(model, hardware, tps, batch),
            prefill_sentence(model, hardware, tps, prompt, mem_util, cal)]


def _first_break(rows: list[Row], figure: str, limit_ms: float) -> Row | None:
    return next((r for r in rows if getattr(r.figures, figure) > limit_ms), None)


def _itl_cause(r: Row, slo: SLO) -> str:
    if r.figures.itl_p50_ms > slo.itl_s * 1e3:
        return "even the median step is over the limit (batch fill: every sequence's KV read in each step)"
    return ("the median step is within it; the tail is steps that also carry another request's prompt "
            "(chunked prefill, Agrawal et al. 2024)")


def _ttft_cause(r: Row, predicted: Row | None) -> str:
    note = (predicted or r).note
    if "queue" in note:
        return "in the model, requests queue for KV-cache space"
    return "in the model, a prompt waits for the step in flight and its prefill shares a step with the running batch"


def _slo_group_sentence(group: list[Row], slo: SLO, predicted: dict[RowKey, Row]) -> str:
    head, top = f"{group[0].key.engine} TP={group[0].key.tp}", group[-1]
    ttft = _first_break(group, "ttft_p99_ms", slo.ttft_s * 1e3)
    itl = _first_break(group, "itl_p99_ms", slo.itl_s * 1e3)
    if ttft is None and itl is None:
        return (f"{head}: both SLOs hold up to batch {top.key.batch} ({_src(top)}: p99 TTFT "
                f"{top.figures.ttft_p99_ms:,.0f} of {slo.ttft_s * 1e3:,.0f} ms, p99 ITL {top.figures.itl_p99_ms:.1f} "
                f"of {slo.itl_s * 1e3:.0f} ms, goodput {top.figures.goodput_share:.0%}).")
    over_itl = itl.figures.itl_p99_ms / (slo.itl_s * 1e3) if itl else 0.0
    over_ttft = ttft.figures.ttft_p99_ms / (slo.ttft_s * 1e3) if ttft else 0.0
    if ttft is None or (itl is not None and (itl.key.batch, -over_itl) < (ttft.key.batch, -over_ttft)):
        return (f"{head}: p99 ITL breaks the {slo.itl_s * 1e3:.0f} ms SLO first, at batch {itl.key.batch} "
                f"({_src(itl)}: {itl.figures.itl_p99_ms:.1f} ms, {over_itl:.2f}x the limit; p99 TTFT "
                f"{itl.figures.ttft_p99_ms:,.0f} ms): {_itl_cause(itl, slo)}; goodput {itl.figures.goodput_share:.0%}.")
    return (f"{head}: p99 TTFT breaks the {slo.ttft_s:.1f} s SLO first, at batch {ttft.key.batch} ({_src(ttft)}: "
            f"{ttft.figures.ttft_p99_ms:,.0f} ms, {over_ttft:.2f}x the limit; p99 ITL "
            f"{ttft.figures.itl_p99_ms:.1f} ms): {_ttft_cause(ttft, predicted.get(ttft.key))}; "
            f"goodput {ttft.figures.goodput_share:.0%}.")


def slo_sentences(rows: Sequence[Row], slo: SLO = SLO()) -> list[str]:
    """Per (engine, TP), which SLO breaks first as the batch grows, and why."""
    best = best_rows(rows)
    predicted = {r.key: r for r in rows if r.status == "predicted"}
    out = []
    for engine, tp in sorted({(k.engine, k.tp) for k in best}):
        group = sorted((r for k, r in best.items() if (k.engine, k.tp) == (engine, tp)), key=lambda r: r.key.batch)
        out.append(_slo_group_sentence(group, slo, predicted))
    return out


def extrapolated_break(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
                       cal: ServeCalibration, max_batch: int = 4096) -> str:
    """The model's first batch (doubling from key.batch) where a p99 crosses its SLO, as a sentence; "" if none."""
    limits = engine_limits(key.engine)
    batch = key.batch * 2
    while batch <= max_batch:
        f = _detail(model, hardware, dataclasses.replace(key, batch=batch), lens, slo, mem_util,
                    resolved(cal, model, hardware, key.tp), limits).figures
        broken = [n for n, v, lim in (("p99 ITL", f.itl_p99_ms, slo.itl_s * 1e3),
                                      ("p99 TTFT", f.ttft_p99_ms, slo.ttft_s * 1e3)) if v > lim]
        if broken:
            return (f"Beyond the sweep, the model puts the first break for {key.engine} TP={key.tp} at batch {batch}: "
                    f"{' and '.join(broken)} (p99 ITL {f.itl_p99_ms:.0f} ms, p99 TTFT {f.ttft_p99_ms:,.0f} ms, "
                    f"{f.throughput_tok_s:,.0f} tok/s).")
        batch *= 2
    return f"The model sees no SLO break for {key.engine} TP={key.tp} up to batch {max_batch}."


def tp_scaling_explanation(rows: Sequence[Row], model: ModelSpec | None = None, hardware: str | None = None,
                           prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = (),
                           mem_util: float = 0.9, calibration: ServeCalibration | None = None) -> list[str]:
    """Where TP scaling breaks: the rows' TP ratios, then (given the model) the step decomposition behind them."""
    out = wont_fit_sentences(rows) + tp_ratio_sentences(rows)
    best = best_rows(rows)
    if model is not None and hardware is not None and len(prompt_tokens) > 0:
        lens = lengths(prompt_tokens, output_tokens)
        out += mechanism_sentences(model, hardware, sorted({k.tp for k in best} | set(TP_LADDER)), lens.context_mean,
                                   float(np.median(lens.prompts)), max((k.batch for k in best), default=1),
                                   mem_util, calibration or ServeCalibration())
    return out


def slo_explanation(rows: Sequence[Row], model: ModelSpec | None = None, hardware: str | None = None,
                    prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = (), slo: SLO = SLO(),
                    mem_util: float = 0.9, calibration: ServeCalibration | None = None) -> list[str]:
    """Which SLO breaks first as the batch grows; where none breaks in the rows, the model's extrapolation."""
    out = slo_sentences(rows, slo)
    best = best_rows(rows)
    if model is None or hardware is None or len(prompt_tokens) == 0:
        return out
    lens = lengths(prompt_tokens, output_tokens)
    for engine, tp in sorted({(k.engine, k.tp) for k in best}):
        top = max((k for k in best if (k.engine, k.tp) == (engine, tp)), key=lambda k: k.batch)
        f = best[top].figures
        if f.itl_p99_ms <= slo.itl_s * 1e3 and f.ttft_p99_ms <= slo.ttft_s * 1e3:
            out.append(extrapolated_break(model, hardware, top, lens, slo, mem_util, calibration or ServeCalibration()))
    return out


def explain_scaling(rows: Sequence[Row], model: ModelSpec | None = None, hardware: str | None = None,
                    prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = (), slo: SLO = SLO(),
                    mem_util: float = 0.9, calibration: ServeCalibration | None = None) -> list[str]:
    """Sentences on where TP scaling breaks and which SLO breaks first, from the rows (measured where there
    are, else predicted) and, given the model and workload, from the model's step decomposition."""
    return (tp_scaling_explanation(rows, model, hardware, prompt_tokens, output_tokens, mem_util, calibration)
            + slo_explanation(rows, model, hardware, prompt_tokens, output_tokens, slo, mem_util, calibration))
