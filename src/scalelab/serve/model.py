"""Analytic model of one row of the serving scaling table, written before the sweep measures it.

A row is a closed loop of B concurrent requests (prompt P_i, output O_i tokens) against one engine instance of
tp GPUs doing continuous batching (Yu et al. 2022, Orca; Kwon et al. 2023, vLLM PagedAttention) with chunked
prefill (Agrawal et al. 2024, Sarathi-Serve). The time of one engine step is serve.stepmodel's roofline; the
row's figures are either the steady state of an endless loop (serve.steady) or, with `requests_per_run`, the
mean of finite runs simulated step by step through the sweep's protocol (serve.simulate: each repeat starts B
requests at once and ends with a drain). The sweep predicts with the protocol (requests_per_run = its
requests per repeat); the steady state extrapolates beyond the rows.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from scalelab.calc.models import ModelSpec
from scalelab.serve.fit import EngineLimits, check_fit, engine_limits, kv_capacity_tokens
from scalelab.serve.metrics import SLO
from scalelab.serve.rows import Row, RowFigures, RowKey
from scalelab.serve.simulate import simulated_figures, simulated_open_figures
from scalelab.serve.steady import Lengths, lengths, steady_state
from scalelab.serve.stepmodel import ServeCalibration, StepModel, StepTerms, resolved, step_model

SCORED_FIGURES = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "goodput_share")
MIN_BAND = 0.05                                                    # floor of a fitted row's interval


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


def _running(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, mem_util: float,
             limits: EngineLimits) -> tuple[int, float]:
    """(b, cap): sequences decoding together, bounded by the batch, max_num_seqs and the KV cache."""
    cap = kv_capacity_tokens(model, hardware, key.tp, mem_util, limits) / lens.context_mean
    return max(1, min(key.batch, limits.max_num_seqs, int(cap))), cap


def _simulated(sm: StepModel, key: RowKey, lens: Lengths, slo: SLO, b: int, limits: EngineLimits,
               cal: ServeCalibration, requests_per_run: int) -> RowFigures:
    return simulated_figures(sm, lens, key, b, limits.max_num_batched_tokens, slo, requests_per_run,
                             cal.request_overhead_s, limits.mixed_prefill)


def detail(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
           cal: ServeCalibration, limits: EngineLimits, requests_per_run: int | None = None) -> RowDetail:
    """Steady state (requests_per_run None), or the mean of simulated runs of that many requests."""
    sm = step_model(model, hardware, key.tp, mem_util, cal)
    b, cap = _running(model, hardware, key, lens, mem_util, limits)
    steady = steady_state(sm, key, lens, slo, b, limits.max_num_batched_tokens, cal.request_overhead_s)
    figures = _simulated(sm, key, lens, slo, b, limits, cal, requests_per_run) if requests_per_run \
        else steady.figures
    q = (b - 1) / lens.output_mean
    return RowDetail(figures, b, cap, lens.context_mean, sm.terms(b, lens.context_mean), 1 - math.exp(-q),
                     steady.queue_s, steady.request_rate_rps, requests_per_run)


def row_figures(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
                cal: ServeCalibration, limits: EngineLimits, requests_per_run: int | None = None) -> RowFigures:
    """detail(...).figures without the steady-state analysis a simulated row does not need (for fitting)."""
    if not requests_per_run:
        return detail(model, hardware, key, lens, slo, mem_util, cal, limits).figures
    sm = step_model(model, hardware, key.tp, mem_util, cal)
    b, _ = _running(model, hardware, key, lens, mem_util, limits)
    return _simulated(sm, key, lens, slo, b, limits, cal, requests_per_run)


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


# ---------------------------------------------------------------------------------------------
# intervals


def corner(cal: ServeCalibration, sign: int) -> ServeCalibration:
    """sign +1: faster (efficiencies up by prior_band, fixed costs down by overhead_band); -1: slower."""
    e, o = 1 + sign * cal.prior_band, 1 - sign * cal.overhead_band
    return dataclasses.replace(cal, hbm_eff=min(1.0, cal.hbm_eff * e), prefill_eff=min(1.0, cal.prefill_eff * e),
                               overhead_tp1_s=cal.overhead_tp1_s * o,
                               sync_per_extra_rank_s=cal.sync_per_extra_rank_s * o,
                               allreduce_latency_s=cal.allreduce_latency_s * o,
                               request_overhead_s=cal.request_overhead_s * o)


def _bounds(name: str, lo: float, hi: float) -> dict[str, float]:
    if name == "goodput_share":
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return {"lo": float(max(lo, 0.0)), "hi": float(hi)}


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
                 f"overheads, all-reduce latency and request overhead x(1 -+ {cal.overhead_band:.0%})")


# ---------------------------------------------------------------------------------------------
# one row


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
    d = detail(model, hardware, key, lens, slo, mem_util, cal, limits, requests_per_run)
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
# an open-loop row: requests sent at given times (a Poisson or gamma schedule), whatever the engine's state


def _open_figures(model: ModelSpec, hardware: str, key: RowKey, lens: Lengths, slo: SLO, mem_util: float,
                  cal: ServeCalibration, limits: EngineLimits, send_times: list[np.ndarray]) -> RowFigures:
    """The open loop simulated step by step; the engine runs at most max_num_seqs or what the KV cache holds
    at the mean context, and the rest queue for a slot (as vLLM's scheduler waits for free blocks)."""
    sm = step_model(model, hardware, key.tp, mem_util, cal)
    cap = kv_capacity_tokens(model, hardware, key.tp, mem_util, limits) / lens.context_mean
    b = max(1, min(limits.max_num_seqs, int(cap)))
    return simulated_open_figures(sm, lens, key, send_times, b, limits.max_num_batched_tokens, slo,
                                  cal.request_overhead_s, limits.mixed_prefill)


def predict_open_row(model: ModelSpec, hardware: str, key: RowKey, prompt_tokens: Sequence[int],
                     output_tokens: Sequence[int], send_times: Sequence[Sequence[float]], slo: SLO, mem_util: float,
                     usd_per_gpu_hour: float, calibration: ServeCalibration | None = None,
                     limits: EngineLimits | None = None) -> Row:
    """The predicted open-loop row: the requests, in order, split into repeats sent at send_times (one array per
    repeat, the sweep's own schedule), each repeat simulated from an idle engine and the figures averaged."""
    limits = limits or engine_limits(key.engine)
    lens = lengths(prompt_tokens, output_tokens)
    times = [np.asarray(t, dtype=float) for t in send_times]
    if sum(len(t) for t in times) != len(lens.prompts):
        raise ValueError(f"predict_open_row: {len(lens.prompts)} requests for {sum(map(len, times))} send times")
    cal = resolved(calibration or ServeCalibration(), model, hardware, key.tp)
    prov = _provenance(model, hardware, lens, slo, mem_util, usd_per_gpu_hour, cal, limits, len(times[0]))
    fit = check_fit(model, hardware, key.tp, mem_util, int((lens.prompts + lens.outputs).max()), limits)
    prov["fit_check"] = fit.reason
    if not fit.fits:
        return Row(key, "wont_fit", RowFigures.nan(), {}, fit.reason, prov)
    figures = _open_figures(model, hardware, key, lens, slo, mem_util, cal, limits, times)
    spread, how = interval(figures, lambda c: _open_figures(model, hardware, key, lens, slo, mem_util, c, limits,
                                                            times), cal)
    prov.update(interval=how, usd_per_1m_output=figures.gpu_hours_per_1m * usd_per_gpu_hour)
    note = (f"open loop: figures are the mean of {len(times)} simulated repeats of {len(times[0])} requests at the "
            f"sweep's own send times, each from an idle engine")
    return Row(key, "predicted", figures, spread, note, prov)
