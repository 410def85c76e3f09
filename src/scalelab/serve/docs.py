"""docs/serve.md from one or more serving sweep folders, from their files alone: every
number is read from a folder or computed from one by the same analysis as its REPORT.md (serve.report.analyze)."""
from __future__ import annotations

import itertools
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Mapping, Sequence

from scalelab.core.sections import Manifest, ManifestError, read_manifest, write_doc
from scalelab.serve.calibrate import RowWorkload
from scalelab.serve.compare import (
    COLUMNS, Comparison, api_source_sentence, comparisons, cost_sentence, figure_score, fmt, score,
)
from scalelab.serve.config import SweepSection
from scalelab.serve.docs_figure import ladder_series, plot_ladders
from scalelab.serve.docs_page import assemble, join_sections
from scalelab.serve.explain import (
    TP_LADDER, slo_explanation, tp_ratio_sentences, tp_scaling_explanation, wont_fit_sentences,
)
from scalelab.serve.harness_doc import harness_md
from scalelab.serve.model import SCORED_FIGURES, predict_row
from scalelab.serve.prices import ApiPrices, blended_usd_per_1m
from scalelab.serve.refit import explain_kwargs, fitted_summary, model_inputs
from scalelab.serve.openloop import knee_scores, knee_sentence, misses_md
from scalelab.serve.report import (
    Analysis, PriceSource, analyze, explained_rows, open_loop_misses, search_line, slo_cost_md,
)
from scalelab.serve.rows import Row, RowKey
from scalelab.serve.sweepdata import SweepData, engine_versions, gpus_phrase, load_sweep, open_loop
from scalelab.serve.table import LOAD_NOTE, MD_COLUMNS, header_line, markdown_row

KNOWN_ENGINES = ("vllm", "sglang")


def measured_closed(a: Analysis) -> list[Row]:
    """The closed-loop rows of a sweep that were measured (status ok)."""
    return [r for r in a.data.measured if r.status == "ok" and not open_loop(r)]


def _workload_phrase(data: SweepData) -> str:
    w = next((r.provenance["workload"] for r in data.predicted if "workload" in r.provenance), None)
    if not w:
        return "workload not recorded"
    source = data.config.get("workload", {}).get("source", "")
    return (f"{source + ' ' if source else ''}requests of mean prompt {w['prompt_mean']:.0f} and mean output "
            f"{w['output_mean']:.0f} tokens on its first row")


def _grid(rows: Sequence[Row], status: str) -> str:
    mine = [r for r in rows if r.status == status and not open_loop(r)]
    if not mine:
        return "no closed-loop row"
    tps = sorted({r.key.tp for r in mine})
    batches = sorted({r.key.batch for r in mine})
    return f"TP {'/'.join(map(str, tps))} x batch {'/'.join(map(str, batches))} ({len(mine)} rows)"


def _where_md(analyses: Sequence[Analysis]) -> list[str]:
    lines = ["## What was measured where", ""]
    for a in analyses:
        d, st = a.data, a.settings
        counts = {s: sum(r.status == s for r in d.measured) for s in ("ok", "wont_fit", "failed")}
        versions = engine_versions(d.provenance, st.engines)
        lines.append(f"- `{d.run_dir.name}`: {st.model_name} on `{st.hardware}` ({gpus_phrase(d.provenance)}), "
                     f"{', '.join(st.engines)}{f' ({versions})' if versions else ''}; measured "
                     f"{_grid(d.measured, 'ok')}; {counts['wont_fit']} row(s) did not fit and {counts['failed']} "
                     f"failed; {_workload_phrase(d)}.")
    return lines + [""]


KINDS = (("prior", "on file, written before the measurement"), ("prior-late", "on file, added after the measurement"),
         ("rerun", "current model, stated priors"), ("held-out", "calibrated, held-out rows"),
         ("tp-check", "fitted on the smallest TP, larger TPs"))


def _kind_comparisons(a: Analysis) -> dict[str, list[Comparison]]:
    out = {k: [c for c in a.comparisons if c.role == k] for k, _ in KINDS if k != "tp-check"}
    if a.tp_check is not None and a.tp_check.calibration is not None:
        out["tp-check"] = [c for c in comparisons(a.data.measured, a.tp_check.rows) if c.role == "held-out"]
    return out


def _scores_table(analyses: Sequence[Analysis]) -> list[str]:
    titles = [COLUMNS[f][0] for f in SCORED_FIGURES]
    lines = ["| Sweep | Prediction | " + " | ".join(titles) + " | All |", "|---|---|" + "---|" * (len(titles) + 1)]
    for a in analyses:
        kinds = _kind_comparisons(a)
        for kind, title in KINDS:
            cs = kinds.get(kind, [])
            if cs:
                s = score(cs)
                lines.append(f"| `{a.data.run_dir.name}` | {title} | "
                             + " | ".join(figure_score(cs, f) for f in SCORED_FIGURES) + f" | {s.within} of {s.n} |")
    return lines


def _predicted_md(analyses: Sequence[Analysis]) -> list[str]:
    lines = ["## Predicted vs measured", "",
             "Figures within ±20% of measured, per prediction, counted only on rows nothing was fitted to. The "
             "current model is run again on each row's own requests in the sweep's protocol (each repeat starts "
             "`batch` requests at once, so the burst of prompts is in the model); its priors changed after these "
             "rows were seen (a 4 ms per-request cost and a 9 us custom all-reduce, both from published "
             "measurements cited in serve/stepmodel.py), so it is not a blind test. The calibrated model is fitted "
             "on batch 1 of every TP and the largest batch of the smallest TP and scored on the other rows.", ""]
    lines += _scores_table(analyses) + [""]
    for a in analyses:
        cal = a.calibrated.calibration
        if cal is not None:
            lines.append(f"- `{a.data.run_dir.name}` calibrated: {fitted_summary(cal)} (fitted on "
                         f"{', '.join(cal.fitted_on)}).")
    return lines + [""]


def _explain_md(analyses: Sequence[Analysis]) -> tuple[list[str], list[str]]:
    tp, slo = ["## Where TP scaling breaks", ""], ["## Which SLO breaks first", ""]
    for a in analyses:
        d, st = a.data, a.settings
        rows = explained_rows(a)
        kw = explain_kwargs(model_inputs(d.predicted, d.measured), a.calibrated.calibration)
        tp += [f"`{d.run_dir.name}` (\"the model\": the calibrated constants):", ""]
        tp += [f"- {s}" for s in wont_fit_sentences(rows) + tp_ratio_sentences(rows) + _decode(rows, kw)] + [""]
        slo += [f"`{d.run_dir.name}` (SLO: TTFT <= {st.slo.ttft_s:g} s, p{st.slo.itl_quantile * 100:g} gap <= "
                f"{st.slo.itl_s * 1e3:g} ms):", ""]
        slo += [f"- {s}" for s in slo_explanation(rows, slo=st.slo, **kw)] + [""]
    return tp, slo


def _decode(rows: Sequence[Row], kw: dict) -> list[str]:
    """The model's batch-1 decode step over the TP ladder: why the fixed share grows with TP."""
    if not kw:
        return []
    text = tp_scaling_explanation(rows, **kw)
    return [s for s in text if s.startswith("Model, batch-1 decode step")]


def _cost_md(analyses: Sequence[Analysis]) -> list[str]:
    lines = ["## $ per 1M output tokens vs a rented API", ""]
    for a in analyses:
        st = a.settings
        hours = [r.figures.gpu_hours_per_1m for r in measured_closed(a)]
        spread = f" The dearest measured row costs {max(hours) / min(hours):.0f}x the cheapest." if hours else ""
        lines.append(f"- `{a.data.run_dir.name}`: " + cost_sentence(a.data.measured, st.usd_per_gpu_hour,
                                                                     st.api, "measured") + spread)
    api = analyses[0].settings.api if analyses else None
    if api is not None:
        lines += ["", api_source_sentence(api)] + (["", *_api_table(analyses)] if api.prices else [])
        lines += ["", "Input:output token ratios: " + "; ".join(
            f"`{a.data.run_dir.name}` from {a.settings.api.ratio_source}" for a in analyses) + "."]
    lines += ["", "An API's figure is what it bills for a sweep's prompts and outputs per 1M output tokens (input "
              "price x the sweep's input:output token ratio + output price), since the self-hosted GPU-hours served "
              "the prompts too. A GPU bills by the hour whether or not it is busy: the self-hosted figure assumes "
              "the row's load is sustained.", ""]
    return lines


def _workload_cell(api: ApiPrices, model: str) -> str:
    """'$0.888 (blended $0.304)': per 1M output tokens of the sweep's workload, and per 1M tokens of either kind."""
    price = next((p for p in api.prices if p.model == model), None)
    if price is None:
        return "not priced"
    mine = f"${api.usd_per_1m_output()[model]:.3f}"
    return mine if api.ratio is None else f"{mine} (blended ${blended_usd_per_1m(price, api.ratio):.3f})"


def _api_table(analyses: Sequence[Analysis]) -> list[str]:
    """The API models' list prices, and per sweep what they bill per 1M output tokens of its workload."""
    runs = [(a.data.run_dir.name, a.settings.api) for a in analyses]
    head = "".join(f" per 1M output tokens of `{name}` ({api.ratio:.2f}:1 in:out) |" if api.ratio is not None
                   else f" `{name}` (ratio not recorded: output price) |" for name, api in runs)
    lines = ["| API model | Provider | Input $/1M | Output $/1M |" + head, "|---|---|---|---|" + "---|" * len(runs)]
    for p in runs[0][1].prices:
        cells = "".join(f" {_workload_cell(api, p.model)} |" for _, api in runs)
        lines.append(f"| {p.model} | {p.provider} | ${p.input_usd_per_1m:.3f} | ${p.output_usd_per_1m:.3f} |" + cells)
    return lines


TTFT_GAP = ("p50 TTFT at batch > 1 is the systematic miss: the model's per-request cost is a constant, the measured "
            "one grows with the batch. The model has no term for load on the API server (one Python process "
            "tokenizes every prompt and detokenizes and streams every token); the likeliest missing cost, not "
            "measured here.")


def _misses_md(analyses: Sequence[Analysis]) -> list[str]:
    """The figures the calibrated model still misses on held-out rows."""
    lines, far_all = ["## What the calibrated model still misses", ""], []
    for a in analyses:
        held = [c for c in a.comparisons if c.role == "held-out" and 0 < c.ratio]
        for f in SCORED_FIGURES:
            far = sorted((c for c in held if c.figure == f and not c.within), key=lambda c: c.ratio)
            far_all += far
            if far:
                lines.append(f"- `{a.data.run_dir.name}` {COLUMNS[f][0]}: " + "; ".join(
                    f"{c.key.label} predicted {fmt(f, c.predicted)}, measured {fmt(f, c.measured)}" for c in far)
                    + ".")
    if not far_all:
        return lines + ["Every held-out figure is within ±20%.", ""]
    ttft = [c for c in far_all if c.figure == "ttft_p50_ms"]
    systematic = ttft and all(c.key.batch > 1 and c.ratio < 1 for c in ttft)
    return lines + (["", TTFT_GAP, ""] if systematic else [""])


def ladder_rows(a: Analysis) -> list[Row]:
    """The calibrated model at the TPs of TP_LADDER that were not measured: for each batch measured at the lowest
    TP, on that row's requests; for each larger batch the config lists (sweep.batch), on the largest measured
    batch's request lengths, cycled to the sweep's protocol for that batch (its requests per repeat)."""
    mi, cal = model_inputs(a.data.predicted, a.data.measured), a.calibrated.calibration
    if mi is None or cal is None:
        return []
    ok = [r for r in measured_closed(a) if r.key.label in mi.workloads]
    if not ok:
        return []
    measured_tps, lowest = {r.key.tp for r in ok}, min(r.key.tp for r in ok)
    out = []
    for key, w in _ladder_workloads(a, [r for r in ok if r.key.tp == lowest], mi.workloads):
        for tp in (t for t in TP_LADDER if t not in measured_tps and t > lowest):
            out.append(predict_row(mi.model, mi.hardware, RowKey(key.engine, tp, key.batch), w.prompt_tokens,
                                   w.output_tokens, mi.slo, mi.mem_util, mi.usd_per_gpu_hour, cal,
                                   requests_per_run=w.requests_per_run))
    return out


def _ladder_workloads(a: Analysis, base: Sequence[Row], workloads: Mapping[str, RowWorkload]
                      ) -> list[tuple[RowKey, RowWorkload]]:
    """(engine and batch, requests) for the ladder: each base row's own; each configured batch larger than the
    base's largest, that row's lengths cycled to repeats x requests per repeat."""
    settings = a.data.config.get("sweep", {})
    sweep = SweepSection(**{f.name: settings[f.name] for f in fields(SweepSection) if f.name in settings})
    out = [(r.key, workloads[r.key.label]) for r in sorted(base, key=lambda r: (r.key.batch, r.key.engine))]
    for engine in sorted({r.key.engine for r in base}):
        top = max((r for r in base if r.key.engine == engine), key=lambda r: r.key.batch)
        w = workloads[top.key.label]
        for batch in sorted(b for b in set(sweep.batch) if b > top.key.batch):
            per_run = sweep.closed_loop_requests(batch)
            n = sweep.repeats * per_run
            cycled = [tuple(itertools.islice(itertools.cycle(t), n)) for t in (w.prompt_tokens, w.output_tokens)]
            out.append((RowKey(engine, 0, batch), RowWorkload(*cycled, per_run)))
    return out


def _ladder_md(a: Analysis) -> list[str]:
    rows = ladder_rows(a)
    fits = [r for r in rows if r.status == "predicted"]
    lines = [f"- `{a.data.run_dir.name}` TP={r.key.tp}: {r.note.split(': ', 1)[-1]}" for r in
             {r.key.tp: r for r in rows if r.status != "predicted"}.values()]
    if not fits:
        return lines
    measured = {r.key.batch for r in measured_closed(a)}
    extra = sorted({r.key.batch for r in fits} - measured)
    if extra:
        lines.append(f"- `{a.data.run_dir.name}` batch {', '.join(map(str, extra))}: in the sweep's config, measured "
                     "at no TP; predicted on the largest measured batch's request lengths, in the sweep's protocol")
    return lines + ["", f"Calibrated-model predictions for `{a.data.run_dir.name}` (not measurements):", "",
                    "| Config | Throughput (tok/s) | p50 ITL (ms) | p99 TTFT (ms) | GPU-hours per 1M |",
                    "|---|---|---|---|---|"] + [
        f"| {r.key.label} | {r.figures.throughput_tok_s:,.0f} | {r.figures.itl_p50_ms:.2f} | "
        f"{r.figures.ttft_p99_ms:,.0f} | {r.figures.gpu_hours_per_1m:.3g} |" for r in fits] + [""]


def _not_measured_md(analyses: Sequence[Analysis], opened: Sequence[Analysis] = ()) -> list[str]:
    ok = [r for a in analyses for r in measured_closed(a)]
    open_engines = {r.key.engine for a in opened for r in a.data.measured if r.status == "ok"}
    lines = ["## What was not measured", ""]
    missing = [tp for tp in TP_LADDER if tp not in {r.key.tp for r in ok}]
    if missing:
        gpus = sorted({gpus_phrase(a.data.provenance) for a in analyses})
        lines.append(f"- TP={', TP='.join(map(str, missing))}: no measured row. An instance needs as many GPUs as "
                     f"its TP, and the sweeps ran on {' and '.join(gpus)}; the rows below are the calibrated model's, "
                     "and the TP check above says how far its TP extrapolation held from TP=1 to TP=2.")
    for engine in KNOWN_ENGINES:
        if any(r.key.engine == engine for r in ok):
            continue
        if engine in open_engines:
            lines.append(f"- {engine}: no closed-loop (batch) row; its open-loop rows are above. Its scheduler "
                         "limits in the model come from its launch flags over assumed defaults "
                         "(serve.fit.limits_for)." + _mixed_only_sentence(opened, engine))
        else:
            lines.append(f"- {engine}: no measured row; its scheduler limits in the model are assumed "
                         f"(serve.fit.ENGINE_LIMITS), untested against a real {engine} server.")
    for a in analyses:
        lines += [f"- `{a.data.run_dir.name}` {r.key.label} failed: {r.note.splitlines()[0] if r.note else ''}"
                  for r in a.data.measured if r.status == "failed"]
    lines.append("")
    for a in analyses:
        lines += _ladder_md(a)
    return lines


def _mixed_only_sentence(opened: Sequence[Analysis], engine: str) -> str:
    """Which of the engine's open-loop folders were predicted before the model had prefill-alone steps (their
    recorded limits have no mixed_prefill): those predictions mixed prompt chunks into every decode step."""
    before = [a.data.run_dir.name for a in opened
              if any(r.key.engine == engine and "mixed_prefill" not in r.provenance.get("limits", {})
                     for r in a.data.predicted_open)]
    if not before:
        return ""
    return (" Predicted before the model had prefill-alone steps (SGLang's default scheduler), so with prompt "
            f"chunks mixed into every decode step: {', '.join(f'`{n}`' for n in before)}.")


def open_loop_only(a: Analysis) -> bool:
    """A sweep measured at request rates alone (a Poisson ladder, a swap at the knee, a rate search)."""
    return bool(a.data.measured) and all(open_loop(r) for r in a.data.measured)


OPEN_LOOP_WHY = ("Requests arrive at a rate (Poisson, or gamma gaps of a stated CV) whether or not earlier ones "
                 "have finished, as users do; the knee is the lowest rate whose goodput share falls below the "
                 "SLO's attainment, and the rate search bisects for the highest rate that meets it.")


def _open_loop_docs_md(analyses: Sequence[Analysis], figure: str = "") -> list[str]:
    """The open-loop sweeps on one page: their rows in one table, the ladders' figure (`figure`: its link, when
    drawn), the knees scored, the searches, the misses by reason and the price at the highest rate meeting the SLO
    (each folder's REPORT.md has the per-rate detail)."""
    if not analyses:
        return []
    name = {id(a): f"{a.data.run_dir.parent.name}/{a.data.run_dir.name}" for a in analyses}
    lines = ["## Open loop: arrivals at a rate, the knee and the rate search", "", OPEN_LOOP_WHY, ""]
    lines += [f"- `{name[id(a)]}`: {a.settings.model_name} on `{a.settings.hardware}` ({gpus_phrase(a.data.provenance)})"
              for a in analyses] + ["", "| Run | " + header_line()[2:], "|---|" + "---|" * len(MD_COLUMNS)]
    lines += [markdown_row(r, f"`{name[id(a)]}`") for a in analyses for r in a.data.measured] + ["", LOAD_NOTE, ""]
    lines += [f"![every Poisson ladder, measured: goodput share, p99 TTFT and p99 ITL against the offered rate]"
              f"({figure})", ""] if figure else []
    knees = [f"- `{name[id(a)]}`: {knee_sentence(k, a.settings.slo.attainment)}"
             for a in analyses for k in knee_scores(a.open_points, a.settings.slo.attainment)]
    searches = [f"- `{name[id(a)]}`: {line}" for a in analyses if (line := search_line(a))]
    lines += ["### The knee, predicted before the run", "", *knees, ""] if knees else []
    lines += ["### The rate searches", "", *searches, ""] if searches else []
    misses = [(name[id(a)], m) for a in analyses for m in open_loop_misses(a)]
    slo = analyses[0].settings.slo
    lines += misses_md([m for _, m in misses], slo.ttft_s, slo.itl_s, [n for n, _ in misses])
    costs = [f"- `{name[id(a)]}`: {line}" for a in analyses for line in slo_cost_md(a.data.measured, a.settings)
             if line]
    return lines + (["### The price at the SLO", "", *costs, ""] if costs else [])


def regenerate_command(run_dirs: Sequence[str | Path], out: str | Path) -> str:
    return "scalelab serve docs " + " ".join(shlex.quote(str(d)) for d in run_dirs) + f" --out {shlex.quote(str(out))}"


def docs_sections(analyses: Sequence[Analysis], command: str = "",
                  crosschecks: Sequence[tuple[Path, str]] = (), figures_dir: Path | None = None
                  ) -> dict[str, list[str]]:
    """The page's generated sections by name, in their default order (SECTION_NAMES); a manifest's [[page]] may
    place them among written prose instead (serve.docs_page). crosschecks: the client checks against `vllm bench
    serve` (file, name printed), the "harness" section. figures_dir: the page's figures/ folder, where the
    open-loop ladders' figure is drawn (none without it)."""
    n_ok = sum(r.status == "ok" for a in analyses for r in a.data.measured)
    opened = [a for a in analyses if open_loop_only(a)]
    analyses = [a for a in analyses if not open_loop_only(a)]
    tp, slo = _explain_md(analyses)
    how = f"Regenerate with `{command}`" if command else "Regenerate it"
    title = ["# Serving: the scaling table, predicted then measured", "",
             f"_{how} (scalelab.serve.docs, from the sweep folders' files and the pinned API price table alone); "
             "edit the code, not "
             "this file._", ""]
    method = ["Before a sweep starts, an analytic model (serve/stepmodel.py: the roofline step time of Pope et al. "
              "2022, two all-reduces per layer after Shoeybi et al. 2019, a fixed per-step overhead; serve/simulate.py: "
              "continuous batching with chunked prefill after Kwon et al. 2023 and Agrawal et al. 2024, run through "
              "the sweep's closed-loop protocol) predicts every row; the sweep then measures them. These folders "
              f"hold {n_ok} measured rows.", ""]
    parts = (title, method, harness_md(crosschecks), _where_md(analyses), _predicted_md(analyses), tp, slo,
             _cost_md(analyses), _open_loop_docs_md(opened, _ladders_figure(opened, figures_dir)),
             _misses_md(analyses), _not_measured_md(analyses, opened))
    return dict(zip(SECTION_NAMES, parts))


LADDERS_FIGURE = "serve_open_loop_ladders.png"


def _ladders_figure(opened: Sequence[Analysis], figures_dir: Path | None) -> str:
    """Draw the ladders' figure into figures_dir; its link relative to the page ("" when nothing is drawn)."""
    series = ladder_series(opened)
    if figures_dir is None or not series:
        return ""
    plot_ladders(series, opened[0].settings.slo, figures_dir / LADDERS_FIGURE)
    return f"{figures_dir.name}/{LADDERS_FIGURE}"


SECTION_NAMES = ("title", "method", "harness", "where", "predicted", "tp", "slo", "cost", "open-loop", "misses",
                 "not-measured")


def docs_markdown(analyses: Sequence[Analysis], command: str = "") -> str:
    return join_sections(docs_sections(analyses, command))


def render_docs(run_dirs: Sequence[str | Path], out: str | Path,
                price_table: PriceSource = None, command: str | None = None, manifest: Manifest | None = None,
                crosschecks: Sequence[tuple[Path, str]] = ()) -> Path:
    """docs/serve.md (or `out`) from the sweep folders' files alone and the pinned API price table; with a
    manifest that has a [[page]], its written prose placed among the generated sections (serve.docs_page)."""
    if not run_dirs:
        raise ValueError("render_docs: no sweep folder given")
    analyses = [analyze(load_sweep(d), price_table) for d in run_dirs]
    sections = docs_sections(analyses, command or regenerate_command(run_dirs, out), crosschecks,
                             Path(out).parent / "figures")
    return write_doc(assemble(manifest, sections), Path(out))


def docs(manifest: str | Path, out: Path | None = None, price_table: PriceSource = None) -> Path:
    """docs/serve.md (the manifest's `out`, or `out`) from the sweep folders the manifest lists."""
    m = read_manifest(manifest, job="serve")
    runs = m.require("runs")
    for i, run in enumerate(runs):
        if not m.path_of(run).is_dir():
            raise ManifestError(f"{m.path}: runs[{i}] = {run} is not a folder")
    crosschecks = [(m.path_of(c), c) for c in m.get("crosschecks", default=[])]
    shown = Path(manifest).as_posix()
    return render_docs([m.path_of(r) for r in runs], out or m.out, price_table, f"scalelab serve docs {shown}", m,
                       crosschecks)
