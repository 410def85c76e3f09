"""Tables for `scalelab calc`, rendered as Markdown or aligned text. Nothing here computes a model number:
it only formats what plan.py and disagg.py returned."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from scalelab.calc.crossover import BAND, Boundary, ScanPoint, labels, verdict
from scalelab.calc.disagg import DisaggResult
from scalelab.calc.models import count_params
from scalelab.calc.parallelism import setup_params
from scalelab.calc.plan import WHY, StepEstimate
from scalelab.core.numfmt import nbytes, pct, seconds
from scalelab.core.tables import table


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def render_markdown(t: Table) -> str:
    return "\n".join([f"**{t.title}**", "", *table(t.headers, t.rows)])


def render_text(t: Table) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(t.headers, *t.rows)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()   # noqa: E731
    return "\n".join([t.title, fmt(t.headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in t.rows])


RENDERERS: dict[str, Callable[[Table], str]] = {"md": render_markdown, "text": render_text}


def render(tables: list[Table], sentences: list[str], fmt: str = "text") -> str:
    body = "\n\n".join(RENDERERS[fmt](t) for t in tables)
    return body + "\n\n" + ("\n\n" if fmt == "md" else "\n").join(sentences) + "\n"


# ---------------------------------------------------------------------------------------------
# training


def _setup_rows(e: StepEstimate) -> tuple[tuple[str, str], ...]:
    s = e.setup
    lay, p, c = s.layout, count_params(s.model), s.cluster
    active = f" ({p.active / 1e9:.1f}B active)" if s.model.is_moe else ""
    link = c.intra["all_reduce"]
    return (("model", f"{s.model.name}: {setup_params(s):,} params{active}, {s.model.n_layers} layers"
             + ("" if s.with_head else " (a bare layer stack: no embedding or head)")),
            ("cluster", f"{c.n_gpus} x {c.hardware.name}, {c.gpus_per_node}/node; NVLink all-reduce "
             f"{link.bus_bw_bytes_s / 1e9:.0f} GB/s bus, {link.latency_s * 1e6:.1f} µs"
             f"{' (calibrated)' if c.calibrated else ''}; NIC {c.inter_bw_bytes_s / 1e9:.0f} GB/s/GPU"),
            ("layout", f"TP={lay.tp}{'+SP' if lay.sp else ''} PP={lay.pp}"
             f"{f' (v={lay.vpp})' if lay.vpp > 1 else ''} DP={lay.dp} ({lay.dp_mode}) CP={lay.cp} EP={lay.ep}; "
             f"recompute={lay.recompute}"),
            ("batch", f"micro-batch {s.batch.micro_batch} x seq {s.batch.seq}, global {s.batch.global_batch} seqs = "
             f"{e.tokens_per_step:,} tokens/step, m={e.micro_batches} micro-batches"
             + (" (forward only)" if s.forward_only else "")),
            ("precision", f"{s.precision.name}; matmuls at {pct(e.compute_eff)} of "
             f"{c.hardware.bf16_tflops:g} TFLOP/s bf16 peak"))


def train_tables(e: StepEstimate) -> list[Table]:
    comm = tuple((t.term.dim, t.term.what, t.term.collective, str(t.term.group_size), t.term.scope,
                  nbytes(t.term.bytes_per_call), f"{t.term.calls_per_step:g}", nbytes(t.term.bytes_per_gpu_step),
                  nbytes(t.bytes_per_token), seconds(t.term.time_s), seconds(t.exposed_s), t.term.window)
                 for t in e.terms)
    comm_table = Table("Communication per step (bytes sent per GPU; per token = whole cluster / tokens)",
                       ("dim", "what", "collective", "n", "link", "size/call", "calls/step", "bytes/GPU/step",
                        "bytes/token", "time/step", "exposed", "hidden behind"), comm)
    return [Table("Setup", ("item", "value"), _setup_rows(e)), comm_table, _step_table(e), _memory_table(e)]


def _step_table(e: StepEstimate) -> Table:
    rows = [("compute", seconds(e.compute.total_s), pct(e.compute.total_s / e.step_s))]
    rows += [(f"{d} exposed", seconds(x), pct(x / e.step_s)) for d, (_, x, _, _) in e.dim_totals().items()]
    if e.setup.layout.pp > 1:
        rows.append((f"pipeline bubble ({pct(e.bubble_fraction)} of step)", seconds(e.bubble_s),
                     pct(e.bubble_s / e.step_s)))
    rows += [("step", seconds(e.step_s), "100%"), ("all comm before overlap", seconds(e.comm_s), ""),
             ("tokens/s", f"{e.tokens_per_s:,.0f}", ""), ("MFU at stated efficiency", pct(e.mfu), ""),
             ("MFU bound (matmuls at 100%)", pct(e.mfu_bound), "")]
    return Table("Step time per GPU", ("term", "time", "share"), tuple(rows))


def _memory_table(e: StepEstimate) -> Table:
    m = e.memory
    rows = (("weights", nbytes(m.weights_bytes)), ("gradients", nbytes(m.grads_bytes)),
            ("optimizer", nbytes(m.optimizer_bytes)), ("activations (peak, first stage)", nbytes(m.activations_bytes)),
            ("logits + gather buffers", nbytes(m.other_bytes)),
            ("total", f"{nbytes(m.total_bytes)} of {nbytes(m.capacity_bytes)}"
                      f" ({'fits' if m.fits else 'DOES NOT FIT'})"))
    return Table("Memory per GPU", ("part", "bytes"), rows)


def train_sentences(e: StepEstimate) -> list[str]:
    seen = dict.fromkeys((t.term.dim, t.term.window) for t in e.terms)
    overlap = "; ".join(f"{d} ({w}): {WHY[w]}" for d, w in seen)
    out = [e.dominant]
    if overlap:
        out.append(f"Overlap assumed: {overlap}.")
    return out


# ---------------------------------------------------------------------------------------------
# disaggregation


def _rps(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "-"


def disagg_setup_table(r: DisaggResult) -> Table:
    w, st = r.workload, r.stats
    rows = (("model / GPU", f"{r.model} on {r.gpu}, TP={r.tp} per instance"),
            ("prompt tokens", w.prompt.describe()), ("output tokens", w.output.describe()),
            ("SLOs", f"TTFT p90 <= {seconds(w.ttft_slo_s)}, mean TPOT <= {seconds(w.tpot_slo_s)}"),
            ("model assumptions", r.assumptions),
            ("KV cache", f"{r.kv_bytes_per_token:,.0f} B/token; fits {st.max_batch:,.0f} running requests "
                         f"of mean context {st.context_mean:,.0f} per instance"),
            ("KV transfer, mean prompt", f"{nbytes(st.prompt_mean * r.kv_bytes_per_token)}: "
             f"{seconds(r.kv_transfer_intra_s)} over NVLink, {seconds(r.kv_transfer_inter_s)} over NICs "
             f"({pct(r.kv_transfer_inter_s / w.ttft_slo_s)} of the TTFT SLO)"),
            ("prefill service time", f"mean {seconds(st.prefill_mean_s)}, p90 {seconds(st.prefill_p90_s)}"))
    return Table("Setup", ("item", "value"), rows)


def capacity_table(r: DisaggResult) -> Table:
    c = r.capacities
    rows = tuple((role, _rps(rate), _rps(rate / r.tp), seconds(s.ttft_p90_s) if s.ttft_p90_s else "-",
                  seconds(s.tpot_s) if s.tpot_s else "-", f"{s.batch:.0f}" if s.batch else "-")
                 for role, rate, s in (("colocated", c.colocated_rps, c.colocated), ("prefill only", c.prefill_rps, c.prefill),
                                       ("decode only", c.decode_rps, c.decode)))
    return Table("Goodput of one instance (requests/s with SLOs met)",
                 ("role", "req/s", "req/s/GPU", "TTFT p90", "TPOT", "decode batch"), rows)


def ratio_table(r: DisaggResult) -> Table:
    shown = [x for x in r.ratios if x.prefill_instances <= 4 and x.decode_instances <= 4]
    if r.best not in shown:
        shown.append(r.best)
    rows = [(f"{x.prefill_instances}:{x.decode_instances}", str(x.gpus), _rps(x.goodput_rps), _rps(x.goodput_per_gpu),
             f"{x.goodput_per_gpu / r.colocated_per_gpu:.2f}x" if r.colocated_per_gpu else "-", x.limited_by)
            for x in shown]
    rows.append(("ideal P:D", "-", "-", _rps(r.fluid_per_gpu),
                 f"{r.fluid_per_gpu / r.colocated_per_gpu:.2f}x" if r.colocated_per_gpu else "-", "balanced"))
    return Table(f"Disaggregated P:D layouts vs colocated ({_rps(r.colocated_per_gpu)} req/s/GPU)",
                 ("P:D", "GPUs", "req/s", "req/s/GPU", "vs colocated", "limited by"), tuple(rows))


def scan_table(title: str, knob: str, points: tuple[ScanPoint, ...], fmt_knob: Callable[[float], str]) -> Table:
    rows = tuple((fmt_knob(p.knob), _rps(p.colocated_per_gpu), _rps(p.disagg_per_gpu),
                  f"{p.ideal_ratio:.2g}" if math.isfinite(p.ideal_ratio) else "-",
                  f"{p.advantage:.2f}x" if math.isfinite(p.advantage) else "-", label)
                 for p, label in zip(points, labels(list(points))))
    return Table(title, (knob, "colocated req/s/GPU", "disagg req/s/GPU", "ideal P/D", "disagg/colo", "verdict"), rows)


def disagg_tables(r: DisaggResult) -> list[Table]:
    tables = [disagg_setup_table(r), capacity_table(r), ratio_table(r)]
    if r.prompt_scan:
        tables.append(scan_table("Crossover in prompt length (prompt distribution rescaled, all else fixed)",
                                 "mean prompt", r.prompt_scan, lambda k: f"{k:,.0f}"))
    if r.tpot_scan:
        tables.append(scan_table("Crossover in TPOT SLO", "TPOT SLO", r.tpot_scan, seconds))
    return tables


def _boundary_text(b: Boundary, unit: Callable[[float], str]) -> str:
    return f"{b.before} -> {b.after} at {unit(b.knob)}"


def disagg_sentences(r: DisaggResult) -> list[str]:
    adv = r.fluid_per_gpu / r.colocated_per_gpu if r.colocated_per_gpu else math.inf
    v = verdict(adv)
    head = {"pays": "Disaggregation pays here", "loses": "Disaggregation does not pay here",
            "wash": f"Disaggregation is a wash here (within +-{BAND:.0%})",
            "SLO infeasible": "Neither layout meets these SLOs"}[v]
    out = [f"{head}: {_rps(r.fluid_per_gpu)} req/s/GPU at the ideal P:D (best small layout "
           f"{r.best.prefill_instances}:{r.best.decode_instances}: {_rps(r.best.goodput_per_gpu)}) vs "
           f"{_rps(r.colocated_per_gpu)} colocated ({adv:.2f}x)."]
    c, st = r.capacities, r.stats
    rho_c, rho_p = c.colocated_rps * st.prefill_mean_s, c.prefill_rps * st.prefill_mean_s
    out.append(f"Why: at capacity a colocated instance spends {pct(rho_c)} of its time in prefill, so its decode "
               f"steps get {seconds((1 - rho_c) * r.workload.tpot_slo_s)} to keep the TPOT SLO and its batch stops at "
               f"{c.colocated.batch:.0f}, against {c.decode.batch:.0f} on a dedicated decode instance; a dedicated "
               f"prefill instance can be kept {pct(rho_p)} busy before the TTFT p90 reaches its SLO, and "
               f"colocation fills the idle rest with decoding.")
    a = r.at_rate
    out.append(f"At {a.rate_rps:g} req/s: colocated needs {a.colocated_gpus} GPUs ({a.colocated_instances} x TP{r.tp}), "
               f"disaggregated {a.disagg_gpus} ({a.prefill_instances} prefill + {a.decode_instances} decode x TP{r.tp}).")
    if r.prompt_boundaries:
        out.append("Prompt-length crossovers: " + "; ".join(
            _boundary_text(b, lambda k: f"{k:,.0f} tokens") for b in r.prompt_boundaries) + ".")
    if r.tpot_boundaries:
        out.append("TPOT-SLO crossovers: " + "; ".join(_boundary_text(b, seconds) for b in r.tpot_boundaries) + ".")
    return out
