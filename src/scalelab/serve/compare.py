"""Predicted against measured, figure by figure, and the Markdown tables and sentences that state it.

Every comparison carries the role of its prediction, so that a row is never scored by constants fitted on it:
  prior       predictions.json, written before the sweep measured the row
  prior-late  predictions.json rows added after the row was measured (same model code, marked in the file)
  rerun       the current model with its stated priors, run again on the measured rows' requests (nothing fitted)
  fitted      the calibration saw this row: reproduction, not evidence
  held-out    calibrated on other rows: the test of the calibrated model
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scalelab.core.numfmt import finite
from scalelab.serve.metrics import compare_to_api
from scalelab.serve.prices import ApiPrices, blended_usd_per_1m
from scalelab.serve.model import SCORED_FIGURES
from scalelab.serve.rows import Row, RowKey
from scalelab.serve.sweepdata import open_loop
from scalelab.serve.table import label as table_label, load_cell

WITHIN = 0.20       # a prediction "holds" when predicted / measured is within 1 +- WITHIN
COLUMNS: dict[str, tuple[str, str]] = {     # figure -> (column title, format)
    "throughput_tok_s": ("Throughput (tok/s)", "{:,.0f}"),
    "ttft_p50_ms": ("p50 TTFT (ms)", "{:,.1f}"),
    "ttft_p99_ms": ("p99 TTFT (ms)", "{:,.1f}"),
    "itl_p50_ms": ("p50 ITL (ms)", "{:,.2f}"),
    "itl_p99_ms": ("p99 ITL (ms)", "{:,.2f}"),
    "goodput_share": ("Goodput @ SLO", "{:.0%}"),
    "gpu_hours_per_1m": ("GPU-hours per 1M output tokens", "{:.3g}"),
}
ROLE_NAMES = {"prior": "prior", "prior-late": "prior (added after the measurement)",
              "rerun": "current model, priors", "fitted": "fitted", "held-out": "held-out"}


@dataclass(frozen=True)
class Comparison:
    key: RowKey
    figure: str
    predicted: float
    measured: float
    lo: float | None
    hi: float | None
    role: str           # a key of ROLE_NAMES

    @property
    def ratio(self) -> float:
        if self.measured == 0:
            return 1.0 if self.predicted == 0 else math.inf
        return self.predicted / self.measured

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= WITHIN

    @property
    def in_interval(self) -> bool | None:
        return None if self.lo is None else self.lo <= self.measured <= self.hi

    @property
    def scored(self) -> bool:
        """Not fitted on: a fair test of the model."""
        return self.role != "fitted"


def role_of(pred: Row) -> str:
    if pred.provenance.get("added_after_measurement"):
        return "prior-late"
    fitted_on = pred.provenance.get("calibration", {}).get("fitted_on", [])
    if not fitted_on:
        return "prior"
    return "fitted" if pred.key.label in fitted_on else "held-out"


def comparisons(measured: Sequence[Row], predicted: Sequence[Row], role: str | None = None) -> list[Comparison]:
    """Every scored figure of every measured closed-loop row that has a prediction; `role` overrides role_of."""
    pred = {r.key: r for r in predicted if r.status == "predicted"}
    out = []
    for m in sorted(measured, key=lambda r: (r.key.engine, r.key.tp, r.key.batch)):
        p = pred.get(m.key)
        if m.status != "ok" or p is None or open_loop(m):
            continue
        for f in SCORED_FIGURES:
            pv, mv = getattr(p.figures, f), getattr(m.figures, f)
            if math.isfinite(pv) and math.isfinite(mv):
                band = p.spread.get(f, {})
                out.append(Comparison(m.key, f, pv, mv, band.get("lo"), band.get("hi"), role or role_of(p)))
    return out


@dataclass(frozen=True)
class Score:
    n: int
    within: int
    worst: Comparison | None


def score(cs: Sequence[Comparison]) -> Score:
    worst = max(cs, key=lambda c: abs(math.log(c.ratio)) if 0 < c.ratio < math.inf else math.inf, default=None)
    return Score(len(cs), sum(c.within for c in cs), worst)


def figure_score(cs: Sequence[Comparison], figure: str) -> str:
    """'3 of 4' for one figure's comparisons."""
    mine = [c for c in cs if c.figure == figure]
    return f"{sum(c.within for c in mine)} of {len(mine)}"


# ---------------------------------------------------------------------------------------------
# Markdown


def fmt(figure: str, value: float) -> str:
    """A figure in its column's format (COLUMNS)."""
    return finite(value, COLUMNS[figure][1])


def render_table(rows: Sequence[Row]) -> str:
    head = "| Config | " + " | ".join(t for t, _ in COLUMNS.values()) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in sorted(rows, key=lambda r: (r.key.engine, r.key.tp, r.key.batch)):
        cells = [fmt(f, getattr(r.figures, f)) for f in COLUMNS]
        label = r.key.label if r.status in ("ok", "predicted") else f"{r.key.label} ({r.status})"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _interval_cell(c: Comparison) -> str:
    if c.lo is None:
        return "—"
    inside = "yes" if c.in_interval else "**no**"
    return f"{fmt(c.figure, c.lo)} – {fmt(c.figure, c.hi)} ({inside})"


def comparison_table(cs: Sequence[Comparison]) -> str:
    lines = ["| Config | Role | Figure | Predicted | Interval (measured inside?) | Measured | Pred/meas | "
             "Within ±20% |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        ratio = "—" if math.isinf(c.ratio) else f"{c.ratio:.2f}"
        lines.append(f"| {c.key.label} | {c.role} | {COLUMNS[c.figure][0]} | {fmt(c.figure, c.predicted)} | "
                     f"{_interval_cell(c)} | {fmt(c.figure, c.measured)} | {ratio} | "
                     f"{'yes' if c.within else '**no**'} |")
    return "\n".join(lines)


def score_sentence(cs: Sequence[Comparison], role: str) -> str:
    s = score([c for c in cs if c.role == role])
    if not s.n:
        return ""
    w = s.worst
    return (f"{ROLE_NAMES[role]} rows: {s.within} of {s.n} figures within ±{WITHIN:.0%} of measured; the furthest "
            f"is {COLUMNS[w.figure][0]} at {w.key.label} (predicted {fmt(w.figure, w.predicted)}, measured "
            f"{fmt(w.figure, w.measured)}, ratio {w.ratio:.2f}).")


def ratio_summary(cs: Sequence[Comparison]) -> str:
    lines = ["| Figure | Scored rows | Within ±20% | Median pred/meas | Furthest pred/meas |", "|---|---|---|---|---|"]
    for f in SCORED_FIGURES:
        mine = [c for c in cs if c.figure == f and c.scored and 0 < c.ratio < math.inf]
        if not mine:
            continue
        ratios = sorted(c.ratio for c in mine)
        far = max(ratios, key=lambda x: abs(math.log(x)))
        lines.append(f"| {COLUMNS[f][0]} | {len(mine)} | {sum(c.within for c in mine)} | "
                     f"{ratios[len(ratios) // 2]:.2f} | {far:.2f} |")
    return "\n".join(lines)


def coverage_sentence(cs: Sequence[Comparison]) -> str:
    inside = [c for c in cs if c.scored and c.in_interval is not None]
    if not inside:
        return ""
    return (f"The measured value falls inside the predicted interval for {sum(bool(c.in_interval) for c in inside)} "
            f"of {len(inside)} scored figures.")


# ---------------------------------------------------------------------------------------------
# cost


def cost_rows(rows: Sequence[Row], usd: float, api: ApiPrices) -> list[tuple[Row, float, dict]]:
    """(row, $ per 1M output tokens, {API model: our $ / the API's $ for the same workload}) per priced row."""
    out = []
    for r in sorted(rows, key=lambda r: (r.key.engine, r.key.tp, r.key.batch)):
        if r.status in ("ok", "predicted") and math.isfinite(r.figures.gpu_hours_per_1m):
            dollars = r.figures.gpu_hours_per_1m * usd
            out.append((r, dollars, compare_to_api(dollars, api.usd_per_1m_output())))
    return out


def api_basis(api: ApiPrices) -> str:
    """What an API's figure in the cost table is, in words."""
    if api.ratio is None:
        return "the output price alone (the workload's input:output token ratio is not recorded)"
    return (f"input x {api.ratio:.2f} + output: what the API bills for this workload's prompts and outputs per 1M "
            f"output tokens, at the workload's {api.ratio:.2f}:1 input:output tokens, from {api.ratio_source}")


def api_source_sentence(api: ApiPrices) -> str:
    if not api.prices:
        return f"No API prices are compared: {api.note}. No other prices are substituted."
    when = f", published on PyPI {api.published}" if api.published else ""
    return (f"API prices: the price table of {api.source}{when}; its per-token costs x 1e6"
            + (f"; {api.note}" if api.note else "") + ".")


def api_price_table(api: ApiPrices) -> str:
    """Input, output and blended prices of each API model, and its $ per 1M output tokens of this workload."""
    if not api.prices:
        return ""
    r = api.ratio
    blend = f"Blended $/1M tokens at {r:.2f}:1" if r is not None else "Blended $/1M tokens"
    lines = [f"| API model | Provider | Input $/1M | Output $/1M | {blend} | $ per 1M output tokens of this workload |",
             "|---|---|---|---|---|---|"]
    for p in api.prices:
        mixed = "—" if r is None else f"${blended_usd_per_1m(p, r):.3f}"
        lines.append(f"| {p.model} | {p.provider} | ${p.input_usd_per_1m:.3f} | ${p.output_usd_per_1m:.3f} | "
                     f"{mixed} | ${api.usd_per_1m_output()[p.model]:.3f} |")
    return "\n".join(lines)


def cost_table(rows: Sequence[Row], usd: float, api: ApiPrices) -> str:
    theirs = api.usd_per_1m_output()
    lines = ["| Config | Load | GPU-hours per 1M | $ per 1M output tokens | "
             + "".join(f"vs {n} (${x:.3f}) | " for n, x in theirs.items()),
             "|---|---|---|---|" + "---|" * len(theirs)]
    for r, dollars, ratios in cost_rows(rows, usd, api):
        lines.append(f"| {table_label(r)} | {load_cell(r)} | {r.figures.gpu_hours_per_1m:.3g} | ${dollars:,.2f} | "
                     + "".join(f"{ratios[n]:.2f}x | " for n in theirs))
    return "\n".join(line.rstrip() for line in lines)


def cost_sentence(rows: Sequence[Row], usd: float, api: ApiPrices, what: str) -> str:
    rs = cost_rows(rows, usd, api)
    if not rs:
        return f"No {what} row has a cost."
    r, dollars, ratios = min(rs, key=lambda t: t[1])
    head = f"The cheapest {what} row is {table_label(r)}: ${dollars:,.2f} per 1M output tokens at ${usd:.2f}/GPU-hour"
    tail = f"; this holds only at that row's sustained load ({load_cell(r)})."
    if not ratios:
        return head + tail
    cheaper = [n for n, x in ratios.items() if x < 1]
    return (head + ", " + (f"below {', '.join(cheaper)}" if cheaper else "above every listed API price")
            + f" ({', '.join(f'{x:.2f}x {n}' for n, x in ratios.items())})" + tail)
