"""REPORT.md of one serving sweep folder, from the folder's files alone (serve.sweepdata).

Predicted against measured three ways, each scored only on rows nothing was fitted to: the predictions on file
(written before the measurement), the current model with its stated priors run again on the measured rows'
requests, and the model calibrated on some rows (serve.calibrate) and scored on the others; with two or more
TPs measured, also the model fitted on the smallest TP alone and scored on the larger ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from scalelab.core.jsonio import write_json
from scalelab.core.provenance import folder_provenance
from scalelab.core.sections import write_doc
from scalelab.serve.compare import (
    Comparison, api_basis, api_price_table, api_source_sentence, comparison_table, comparisons, cost_sentence,
    cost_table, coverage_sentence, ratio_summary, render_table, score_sentence,
)
from scalelab.serve.explain import explain_scaling
from scalelab.serve.openloop import (
    Misses, RatePoint, misses_md, open_loop_md, poisson_ladders, rate_points, read_search, row_misses,
    search_sentence,
)
from scalelab.serve.plots import plot_open_loop, plot_predicted_vs_measured
from scalelab.serve.prices import PriceTable
from scalelab.serve.refit import (
    Calibrated, calibrate, explain_kwargs, fitted_summary, model_inputs, rerun_priors, tp_check,
)
from scalelab.serve.rows import Row
from scalelab.serve.table import arrival_cv, offered, rate_rps
from scalelab.serve.stepmodel import ServeCalibration, resolved
from scalelab.serve.sweepdata import Settings, SweepData, engine_versions, find_key, gpus_phrase, load_sweep, settings

SPLIT_WHY = (
    "Split (serve.calibrate.default_fit_labels): batch 1 of every TP pins that TP's fixed costs (the weights read "
    "per step, the step overhead, the all-reduce latency) and the per-request overhead; the largest batch of the "
    "smallest TP pins the batch slope (KV reads, prefill chunks merged into decode steps). Held out: the middle "
    "batches (the batch curve between fitted ends) and the large batches of the larger TPs (the smallest TP's "
    "slope carried to another TP). Fitting the smallest TP alone instead would leave the all-reduce latency at "
    "its prior; that harder test is the TP check below")
RERUN_WHY = (
    "Run again after the measurement, on each row's own requests in the sweep's protocol (runs of its requests "
    "per repeat, each starting `batch` requests at once), with nothing fitted: not a pre-registered prediction, "
    "but the test of the model's stated priors as they stand")
CONSTANTS = (("hbm_eff", 1.0, "{:.3f}"), ("prefill_eff", 1.0, "{:.3f}"), ("overhead_tp1_s", 1e3, "{:.2f} ms"),
             ("sync_per_extra_rank_s", 1e3, "{:.2f} ms"), ("allreduce_latency_s", 1e6, "{:.1f} us"),
             ("request_overhead_s", 1e3, "{:.1f} ms"))


@dataclass(frozen=True)
class Analysis:
    data: SweepData
    settings: Settings
    rerun: tuple[Row, ...]                  # the current model's priors on the measured rows
    calibrated: Calibrated                  # fitted on default_fit_labels
    tp_check: Calibrated | None             # fitted on the smallest TP alone; None with one TP measured
    comparisons: tuple[Comparison, ...]     # the predictions on file, the rerun, the calibrated predictions
    open_points: tuple[RatePoint, ...] = ()  # open-loop rows beside their predictions (serve.openloop)


# A price table, or what reads one; None = the pinned wheel's (serve.prices.pinned_table)
PriceSource = PriceTable | Callable[[], PriceTable] | None


def analyze(data: SweepData, price_table: PriceSource = None) -> Analysis:
    rerun = rerun_priors(data.measured, data.predicted)
    cal = calibrate(data.measured, data.predicted)
    cs = (comparisons(data.measured, data.predicted) + comparisons(data.measured, rerun, "rerun")
          + comparisons(data.measured, cal.rows))
    return Analysis(data, settings(data, price_table), rerun, cal, tp_check(data.measured, data.predicted), tuple(cs),
                    tuple(rate_points(data.measured, data.predicted_open)))


def explained_rows(a: Analysis) -> list[Row]:
    """The measured rows, then the model's: the calibrated predictions where there are, else those on file."""
    return list(a.data.measured) + list(a.calibrated.rows or a.data.predicted)


def scaling_explanation(a: Analysis) -> list[str]:
    rows = explained_rows(a)
    kw = explain_kwargs(model_inputs(a.data.predicted, a.data.measured), a.calibrated.calibration)
    return explain_scaling(rows, slo=a.settings.slo, **kw)


def _header(data: SweepData, st: Settings) -> list[str]:
    prov = data.provenance
    versions = engine_versions(prov, st.engines)
    lines = [f"# Serving sweep: {st.model_name}", "",
             f"- hardware: `{st.hardware}`; GPUs recorded: {gpus_phrase(prov)}",
             f"- engine: {', '.join(st.engines) or 'none'}" + (f" ({versions})" if versions else ""),
             f"- git: {find_key(prov, 'git_sha') or 'not recorded'}; command: `{find_key(prov, 'command') or '—'}`",
             f"- SLO: TTFT <= {st.slo.ttft_s:g} s and each request's p{st.slo.itl_quantile * 100:g} gap <= "
             f"{st.slo.itl_s * 1e3:g} ms"]
    note = find_key(prov, "reconstructed")
    return lines + ([f"- provenance: {note}"] if isinstance(note, str) else []) + [""]


def _interval_how(rows: Sequence[Row]) -> str:
    how = next((r.provenance.get("interval") for r in rows if r.provenance.get("interval")), None)
    return f"Intervals: {how}." if how else ""


def constants_table(cal: ServeCalibration, prior: ServeCalibration) -> str:
    lines = ["| Constant | Prior | Fitted |", "|---|---|---|"]
    for name, scale, form in CONSTANTS:
        p, f = getattr(prior, name), getattr(cal, name)
        cells = [form.format(v * scale) if v is not None else "link alpha" for v in (p, f)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]}{'' if name in cal.fitted_params else ' (kept)'} |")
    return "\n".join(lines)


def _file_md(a: Analysis) -> list[str]:
    cs = [c for c in a.comparisons if c.role in ("prior", "prior-late")]
    lines = ["### Predicted before the sweep", ""]
    if not cs:
        return lines + ["No measured row has a prediction made before the sweep.", ""]
    lines += [s for s in (score_sentence(cs, r) for r in ("prior", "prior-late")) if s]
    if any(c.role == "prior-late" for c in cs):
        late = next(r for r in a.data.predicted if r.provenance.get("added_after_measurement"))
        lines.append(f"The prior (added after the measurement) rows were predicted by the same model code (commit "
                     f"{late.provenance.get('model_commit', 'not recorded')}) after those rows had been measured: "
                     "the code had not changed, but the numbers were not on file before the measurement.")
    return lines + [_interval_how(a.data.predicted), "", comparison_table(cs), ""]


def _rerun_md(a: Analysis) -> list[str]:
    cs = [c for c in a.comparisons if c.role == "rerun"]
    if not cs:
        return []
    return ["### The current model with its stated priors", "", f"{RERUN_WHY}. {ServeCalibration().source}.", "",
            score_sentence(cs, "rerun"), "", ratio_summary(cs), ""]


def _calibrated_md(a: Analysis) -> list[str]:
    cal = a.calibrated
    lines = ["### Calibrated on some measured rows, scored on the others", "", f"Calibration: {cal.note}.", ""]
    cs = [c for c in a.comparisons if c.role in ("fitted", "held-out")]
    if cal.calibration is None or not cs:
        return lines
    mi = model_inputs(a.data.predicted, a.data.measured)
    prior = resolved(ServeCalibration(), mi.model, mi.hardware, 2) if mi else ServeCalibration()
    lines += [f"{SPLIT_WHY}.", "", constants_table(cal.calibration, prior), ""]
    lines += [s for s in (score_sentence(cs, r) for r in ("held-out", "fitted")) if s]
    held = [c for c in cs if c.role == "held-out"]
    lines += ["", "Held-out rows, figure by figure:", "", ratio_summary(held), "", coverage_sentence(held),
              _interval_how(cal.rows), "", comparison_table(cs), ""]
    return lines


def _tp_check_md(a: Analysis) -> list[str]:
    t = a.tp_check
    if t is None or t.calibration is None:
        return []
    cs = [c for c in comparisons(a.data.measured, t.rows) if c.role == "held-out"]
    tp = min(r.key.tp for r in a.data.measured if r.key.label in t.calibration.fitted_on)
    return [f"### TP check: fitted on the TP={tp} rows alone, scored on the larger TPs", "",
            f"The test of predicting a TP that was not fitted on, which is what the model does for TPs that were "
            f"not measured. Fitted {fitted_summary(t.calibration)} on {', '.join(t.calibration.fitted_on)}; the "
            "other constants are the priors.", "", score_sentence(cs, "held-out"), "", ratio_summary(cs), ""]


def open_loop_misses(a: Analysis) -> list[Misses]:
    """Each measured open-loop row's requests by the part of the SLO they miss, in rate order."""
    slo = a.settings.slo
    rows = sorted((r for r in a.data.measured if r.status == "ok" and rate_rps(r) is not None), key=rate_rps)
    return [m for r in rows if (m := row_misses(a.data.run_dir, r, slo.ttft_s, slo.itl_s, slo.itl_quantile))]


def search_line(a: Analysis) -> str | None:
    """The rate search's answer and probes on one line; None when the folder holds no search."""
    search = read_search(a.data.run_dir)
    return search_sentence(search).replace("\n", "; ") if search else None


def _open_loop_md(a: Analysis) -> list[str]:
    slo, found = a.settings.slo, search_line(a)
    return (["### The rate search", "", found, ""] if found else []) + open_loop_md(a.open_points, slo.attainment) \
        + misses_md(open_loop_misses(a), slo.ttft_s, slo.itl_s)


OPEN_LOOP_FIGURE = "figures/open_loop_predicted_vs_measured.png"


def comparison_md(a: Analysis) -> list[str]:
    lines = ["## Predicted vs measured", ""] + _open_loop_md(a)
    if any(rate_rps(r) is None for r in a.data.measured) or not a.data.predicted_open:
        lines += _file_md(a) + _rerun_md(a) + _calibrated_md(a) + _tp_check_md(a)
    if poisson_ladders(a.open_points):
        lines += [f"![open loop, predicted vs measured]({OPEN_LOOP_FIGURE})", ""]
    if a.comparisons:
        lines += ["![predicted vs measured](figures/predicted_vs_measured.png)", ""]
    return lines


def render_report(a: Analysis) -> str:
    data, st = a.data, a.settings
    lines = _header(data, st) + ["## Measured table", ""]
    lines += [data.table_md.strip() if data.table_md else render_table(data.measured), ""]
    lines += comparison_md(a)
    lines += ["## Where scaling breaks", ""] + [f"- {s}" for s in scaling_explanation(a)] + [""]
    return "\n".join(lines + cost_md(data.measured, st))


def cost_md(rows: Sequence[Row], st: Settings) -> list[str]:
    """Self-hosted $ per 1M output tokens per row, set against the configured API models' prices."""
    api = st.api
    lines = ["## Cost per 1M output tokens", "", f"At ${st.usd_per_gpu_hour:.2f} per GPU-hour ({st.usd_source}). "
             + api_source_sentence(api), ""]
    if api.prices:
        lines += [api_price_table(api), "", f"Each API's figure below is {api_basis(api)}.", ""]
    return lines + [cost_table(rows, st.usd_per_gpu_hour, api), "",
                    cost_sentence(rows, st.usd_per_gpu_hour, api, "measured"), ""] + slo_cost_md(rows, st)


def slo_cost_md(rows: Sequence[Row], st: Settings) -> list[str]:
    """The price at the highest open-loop rate that meets the SLO: a row past the knee is cheaper per token only
    because its requests miss the SLO."""
    meeting = [r for r in rows if r.status == "ok" and rate_rps(r) is not None and arrival_cv(r) in (None, 1.0)
               and r.figures.goodput_share >= st.slo.attainment]
    if not meeting:
        return []
    best = max(meeting, key=rate_rps)
    usd = best.figures.gpu_hours_per_1m * st.usd_per_gpu_hour
    return [f"At the highest Poisson rate that meets the SLO ({offered(best)}, goodput "
            f"{best.figures.goodput_share:.0%}): {best.figures.gpu_hours_per_1m:.3g} GPU-hours and ${usd:.2f} per "
            f"1M output tokens.", ""]


def report(run_dir: str | Path, price_table: PriceSource = None) -> Path:
    """REPORT.md, figures/predicted_vs_measured.png and predictions_calibrated.json of one sweep folder, from
    its files alone and the pinned API price table."""
    a = analyze(load_sweep(run_dir), price_table)
    folder = a.data.run_dir
    if a.calibrated.rows:
        write_json(folder / "predictions_calibrated.json", {"calibration": a.calibrated.calibration.to_dict(),
                                                            "rows": [r.to_dict() for r in a.calibrated.rows],
                                                            "provenance": folder_provenance(folder)})
    if a.comparisons:
        plot_predicted_vs_measured(a.comparisons, folder / "figures" / "predicted_vs_measured.png")
    ladders = poisson_ladders(a.open_points)
    if ladders:
        plot_open_loop(ladders, a.settings.slo, folder / OPEN_LOOP_FIGURE)
    return write_doc(render_report(a), folder / "REPORT.md")


write_report = report   # the name callers have used
