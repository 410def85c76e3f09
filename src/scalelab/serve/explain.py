"""Sentences on a scaling table: where TP scaling breaks and which SLO breaks first, from the rows (measured where
there are, else predicted) and, given the model and the workload, from the step model's decomposition."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from scalelab.calc.models import ModelSpec
from scalelab.core.hardware import get_hardware
from scalelab.serve.fit import check_fit, engine_limits
from scalelab.serve.metrics import SLO
from scalelab.serve.model import detail
from scalelab.serve.rows import Row, RowKey
from scalelab.serve.steady import Lengths, lengths
from scalelab.serve.stepmodel import ServeCalibration, StepTerms, allreduce_latency_s, resolved, step_model

TP_LADDER = (1, 2, 4, 8)                                           # the TPs the model explains beyond the rows


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
        f = detail(model, hardware, dataclasses.replace(key, batch=batch), lens, slo, mem_util,
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
