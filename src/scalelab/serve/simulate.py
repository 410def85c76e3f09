"""A finite closed-loop run, step by step: the sweep's protocol, through the step model (serve.stepmodel).

Each of the sweep's repeats starts `batch` requests at once and ends when the last one drains, so its figures
carry a start burst (B prompts queued behind each other in max_num_batched_tokens chunks, Agrawal et al. 2024),
a steady middle and a drain at a falling batch, which the steady state (serve.steady) has not. Each request
reaches the engine request_overhead_s after its client sends it (HTTP, tokenization, the hand-off to the engine
core), and joins the first step launched after that. Which step admits a request thus depends on step lengths:
figures jump a little when a step end crosses an arrival (serve.calibrate steps its derivatives over those).

Two schedulers: prompt chunks mixed into the decode step (vLLM; SGLang with --enable-mixed-chunk), or a step that
prefills alone whenever a prompt is waiting (SGLang's default), which every decoding request waits out: its gap
then spans the prefill steps and the decode step after them. The trace's steps are the decode steps (one gap of
each decoding request), each carrying the prefill-only time before it.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from scalelab.serve.metrics import SLO
from scalelab.serve.rows import RowFigures, RowKey
from scalelab.serve.steady import Dist, Lengths
from scalelab.serve.stepmodel import StepModel


@dataclass(frozen=True)
class RunTrace:
    ttft_s: np.ndarray          # (n,) per request, its send to its first token
    judged_gap_s: np.ndarray    # (n,) each request's slo.itl_quantile gap ("higher"), 0 without gaps
    step_s: np.ndarray          # (steps,) every engine step
    decoders: np.ndarray        # (steps,) gaps each step closed (one per decoding sequence)
    duration_s: float           # first send (an open loop: the run start) -> last token
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


def _arrivals(t: float, idle: bool, pending: deque, queue: deque) -> float:
    """Queue the requests that reached the engine before the step starting at t (one arriving exactly at t
    finds that step launched); an idle engine starts its step at the next arrival. Returns the step's start."""
    if idle and pending:
        t = max(t, pending[0][0])
    while pending and (pending[0][0] < t or (idle and pending[0][0] <= t)):
        queue.append(pending.popleft()[1])
    return t


def simulate_run(sm: StepModel, prompts: np.ndarray, outputs: np.ndarray, batch: int, max_running: int,
                 budget: int, quantile: float, request_overhead_s: float = 0.0,
                 send_times: np.ndarray | None = None, mixed: bool = True) -> RunTrace:
    """All requests through a closed loop of `batch` clients: the first `batch` are sent at t = 0, each later
    one when another finishes; or, given send_times (ascending), an open loop: request i is sent at
    send_times[i] whatever the engine's state. Each reaches the engine request_overhead_s after it is sent.
    mixed False: a step with a prompt to prefill runs without the decodes (module docstring)."""
    n = len(prompts)
    sent, first, start, early = np.zeros(n), np.zeros(n), np.zeros(n, dtype=int), np.zeros(n)
    nxt = min(batch, n) if send_times is None else n                 # an open loop sends nothing on a finish
    if send_times is not None:   # from the run start, as the measured open loop counts (metrics: from_origin)
        sent = np.asarray(send_times, dtype=float).copy()
    pending = deque((sent[i] + request_overhead_s, i) for i in range(nxt))  # (engine arrival time, request)
    queue, prefilling, finishing = deque(), [], []
    e, t, steps, decs = _Engine(), 0.0, [], []
    paused = 0.0                # prefill-only time since the last decode step (mixed False): every decoder waits it
    while e.finished < n:
        if e.d and not (prefilling or queue or pending) and not paused and finishing[0][0] > len(steps):
            t = _fast_forward(sm, e, finishing[0][0] - len(steps), t, steps, decs)
            continue
        t = _arrivals(t, e.d == 0 and not prefilling and not queue, pending, queue)
        while queue and e.running < max_running:
            prefilling.append([queue.popleft(), 0])
            e.running += 1
        alone = not mixed and e.d > 0 and bool(prefilling)
        tokens, pairs, completed = _prefill_chunks(prefilling, prompts, budget if alone else budget - e.d)
        if e.d == 0 and tokens == 0:
            raise RuntimeError("simulate_run: no work and no arrival (max_running < 1?)")
        if alone:               # the decoders' next gap grows by this step; new tokens come on the next decode step
            dt = sm.scalar_step_s(0, 0.0, tokens, pairs)
            t, paused, k = t + dt, paused + dt, len(steps) - 1
        else:
            dt = sm.scalar_step_s(e.d, e.ctx_sum, tokens, pairs)
            t, k = t + dt, len(steps)
            steps.append(dt + paused)
            decs.append(e.d)
            e.ctx_sum += e.d
            paused = 0.0
            while finishing and finishing[0][0] == k:
                _, i = heapq.heappop(finishing)
                e.d, e.ctx_sum = e.d - 1, e.ctx_sum - prompts[i] - outputs[i]
                nxt = _finish(e, t, nxt, sent, pending, request_overhead_s)
        for _ in range(completed):
            i = prefilling.pop(0)[0]
            first[i], start[i], early[i] = t, k + 1, paused   # its first gap starts at t, not at the pause's start
            if outputs[i] <= 1:
                nxt = _finish(e, t, nxt, sent, pending, request_overhead_s)
            else:
                e.d, e.ctx_sum = e.d + 1, e.ctx_sum + prompts[i] + 1
                heapq.heappush(finishing, (k + int(outputs[i]) - 1, i))
    return _trace(np.array(steps), np.array(decs), first - sent, start, outputs, quantile, t, early)


def simulated_open_figures(sm: StepModel, lens: Lengths, key: RowKey, send_times: list[np.ndarray], max_running: int,
                           budget: int, slo: SLO, request_overhead_s: float = 0.0, mixed: bool = True) -> RowFigures:
    """Mean over an open loop's repeats: repeat j is the next len(send_times[j]) requests sent at those times,
    each starting on an idle engine (the sweep waits for a repeat's last request before the next one)."""
    per_run, lo = [], 0
    for times in send_times:
        sl = slice(lo, lo + len(times))
        tr = simulate_run(sm, lens.prompts[sl], lens.outputs[sl], 0, max_running, budget, slo.itl_quantile,
                          request_overhead_s, np.asarray(times), mixed)
        per_run.append(trace_figures(tr, key.tp, slo))
        lo += len(times)
    names = [f.name for f in dataclasses.fields(RowFigures)]
    return RowFigures(*(float(np.mean([getattr(f, n) for f in per_run])) for n in names))


def _fast_forward(sm: StepModel, e: _Engine, n: int, t: float, steps: list, decs: list) -> float:
    """n decode-only steps (nothing to prefill, nobody finishing, nobody arriving) at once."""
    dts = sm.decode_run_s(e.d, e.ctx_sum, n)
    steps.extend(dts.tolist())
    decs.extend([e.d] * n)
    e.ctx_sum += e.d * n
    return t + float(dts.sum())


def _finish(e: _Engine, t: float, nxt: int, sent: np.ndarray, pending: deque, overhead_s: float) -> int:
    """A request ends at t: its client sends the next one at once."""
    e.running, e.finished = e.running - 1, e.finished + 1
    if nxt < len(sent):
        sent[nxt] = t
        pending.append((t + overhead_s, nxt))
        nxt += 1
    return nxt


def _trace(steps: np.ndarray, decs: np.ndarray, ttft: np.ndarray, start: np.ndarray, outputs: np.ndarray,
           quantile: float, t: float, early: np.ndarray) -> RunTrace:
    """early[i]: the part of request i's first step (prefill-only time) that passed before its first token."""
    judged = np.zeros(len(ttft))
    for i, (s, o) in enumerate(zip(start, outputs.astype(int))):
        if o >= 2:                                      # its O - 1 gaps are the steps s .. s + O - 2
            rank = math.ceil(quantile * (o - 2))        # numpy's "higher" order statistic of O - 1 gaps
            gaps = steps[s:s + o - 1].copy()
            gaps[0] -= early[i]
            judged[i] = np.partition(gaps, rank)[rank]
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
                      requests_per_run: int, request_overhead_s: float = 0.0, mixed: bool = True) -> RowFigures:
    """Mean over consecutive runs of `requests_per_run` requests, as the sweep averages its repeats."""
    per_run = []
    for lo in range(0, len(lens.prompts), requests_per_run):
        sl = slice(lo, lo + requests_per_run)
        tr = simulate_run(sm, lens.prompts[sl], lens.outputs[sl], key.batch, max_running, budget, slo.itl_quantile,
                          request_overhead_s, mixed=mixed)
        per_run.append(trace_figures(tr, key.tp, slo))
    names = [f.name for f in dataclasses.fields(RowFigures)]
    return RowFigures(*(float(np.mean([getattr(f, n) for f in per_run])) for n in names))
