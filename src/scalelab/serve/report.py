"""REPORT.md of one serving sweep folder, and docs/serve.md from one or more folders.

Everything is read from the folder alone (DESIGN.md principle 3): predictions.json (the analytic model's rows,
written before the sweep), rows.jsonl (measured rows, one JSON object per line; the last line of a key wins),
config.toml, provenance.json, and table.md when the sweep wrote one. Every sentence is built from those numbers.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from scalelab.calc.models import ModelSpec
from scalelab.core.hardware import HARDWARE
from scalelab.core.jsonio import iter_jsonl, read_json, write_json
from scalelab.serve.metrics import EXAMPLE_API_PRICES_USD_PER_1M_OUTPUT, SLO, compare_to_api
from scalelab.serve.model import (
    SCORED_FIGURES, RowWorkload, ServeCalibration, calibration_from_dict, explain_scaling, fit_calibration,
    predict_row, slo_explanation, tp_scaling_explanation,
)
from scalelab.serve.rows import Row, RowKey, row_from_dict

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
KNOWN_ENGINES = ("vllm", "sglang")
TP_LADDER = (1, 2, 4, 8)


class ReportInputError(FileNotFoundError):
    """A file the report needs is missing or unreadable; the message names it."""


# ---------------------------------------------------------------------------------------------
# reading the folder


@dataclass(frozen=True)
class SweepData:
    run_dir: Path
    config: dict
    provenance: dict
    predicted: tuple[Row, ...]
    measured: tuple[Row, ...]
    table_md: str | None


def _need(run_dir: Path, name: str, what: str) -> Path:
    path = run_dir / name
    if not path.is_file():
        raise ReportInputError(f"{path}: not found; the serving report needs {name} ({what})")
    return path


def _row(d: dict, where: str) -> Row:
    """A Row from JSON, whose NaN figures were written as strings (core.jsonio.json_safe)."""
    try:
        figures = {k: float(v) for k, v in d["figures"].items()}
        return row_from_dict({**d, "figures": figures})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a serving row ({type(e).__name__}: {e})") from None


def read_predicted(run_dir: Path) -> tuple[Row, ...]:
    path = _need(run_dir, "predictions.json", "the analytic model's rows, written before the sweep")
    data = read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of rows (or an object with a 'rows' list)")
    return tuple(_row(d, f"{path} row {i}") for i, d in enumerate(rows))


def open_loop(r: Row) -> bool:
    """A row measured at a request rate (the sweep's rate mode) rather than a fixed concurrency."""
    return r.provenance.get("load", {}).get("mode") == "rate" or r.key.batch < 1


def read_measured(run_dir: Path) -> tuple[Row, ...]:
    """The last row written for each point (a retried failure is replaced by its retry)."""
    path = _need(run_dir, "rows.jsonl", "the measured rows, one JSON object per line")
    last: dict[tuple, Row] = {}
    for i, d in enumerate(iter_jsonl(path), 1):
        r = _row(d, f"{path}:{i}")
        last[(r.key, r.provenance.get("load", {}).get("rate_rps"))] = r
    return tuple(last.values())


def load_sweep(run_dir: str | Path) -> SweepData:
    run_dir = Path(run_dir)
    cfg_path = _need(run_dir, "config.toml", "the sweep's resolved config")
    try:
        config = tomllib.loads(cfg_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{cfg_path}: invalid TOML: {e}") from None
    prov = read_json(_need(run_dir, "provenance.json", "versions, hardware and command of the sweep"))
    table = run_dir / "table.md"
    return SweepData(run_dir, config, prov if isinstance(prov, dict) else {}, read_predicted(run_dir),
                     read_measured(run_dir), table.read_text() if table.is_file() else None)


# ---------------------------------------------------------------------------------------------
# settings from the config, the provenance and the predictions' own record


def find_key(tree: Any, key: str) -> Any:
    """The value of the first `key` in a nested dict, breadth first; None if absent."""
    level = [tree]
    while level:
        nxt = []
        for node in level:
            if isinstance(node, dict):
                if key in node:
                    return node[key]
                nxt += list(node.values())
        level = nxt
    return None


@dataclass(frozen=True)
class Settings:
    hardware: str
    engines: tuple[str, ...]
    model_name: str
    usd_per_gpu_hour: float
    usd_source: str
    api_prices: dict[str, float]
    slo: SLO


def _usd(cfg: dict, pred_prov: dict, hardware: str) -> tuple[float, str]:
    cost = cfg.get("cost") if isinstance(cfg.get("cost"), dict) else {}
    for value, where in ((cost.get("usd_per_gpu_hour"), "config.toml [cost] usd_per_gpu_hour"),
                         (find_key(cfg, "usd_per_gpu_hour"), "config.toml usd_per_gpu_hour"),
                         (pred_prov.get("usd_per_gpu_hour"), "predictions.json")):
        if isinstance(value, (int, float)) and value >= 0:     # the config's -1 means "the hardware default"
            return float(value), where
    if hardware in HARDWARE:
        return HARDWARE[hardware].price_per_hour, f"core/hardware.py default for {hardware}"
    return math.nan, "no price found"


def _slo(cfg: dict, pred_prov: dict) -> SLO:
    table = cfg.get("slo") if isinstance(cfg.get("slo"), dict) else find_key(cfg, "slo")
    src = table if isinstance(table, dict) else pred_prov.get("slo", {})
    names = {f.name for f in dataclasses.fields(SLO)}
    return SLO(**{k: float(v) for k, v in (src or {}).items() if k in names})


def _model_name(cfg: dict, pred_prov: dict) -> str:
    m = find_key(cfg, "model")
    if isinstance(m, dict):
        m = m.get("shape") or m.get("name") or m.get("path") or m.get("id")
    return str(m or pred_prov.get("model_spec", {}).get("name", "unknown model"))


def settings(data: SweepData, api_prices: Mapping[str, float] | None = None) -> Settings:
    pred_prov = data.predicted[0].provenance if data.predicted else {}
    hw = find_key(data.config, "hardware") or find_key(data.config, "gpu") or pred_prov.get("hardware", "unknown")
    hw = hw if isinstance(hw, str) else str(hw.get("name", "unknown")) if isinstance(hw, dict) else str(hw)
    usd, usd_source = _usd(data.config, pred_prov, hw)
    prices = api_prices or find_key(data.config, "api_prices_usd_per_1m_output") or EXAMPLE_API_PRICES_USD_PER_1M_OUTPUT
    engines = tuple(sorted({r.key.engine for r in data.measured + data.predicted}))
    return Settings(hw, engines, _model_name(data.config, pred_prov), usd, usd_source,
                    {str(k): float(v) for k, v in dict(prices).items()}, _slo(data.config, pred_prov))


# ---------------------------------------------------------------------------------------------
# predicted vs measured


@dataclass(frozen=True)
class Comparison:
    key: RowKey
    figure: str
    predicted: float
    measured: float
    lo: float | None
    hi: float | None
    role: str           # "fitted" (the calibration saw this row), "held-out", or "prior" (nothing was fitted)

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
    fitted_on = pred.provenance.get("calibration", {}).get("fitted_on", [])
    if not fitted_on:
        return "prior"
    return "fitted" if pred.key.label in fitted_on else "held-out"


def comparisons(measured: Sequence[Row], predicted: Sequence[Row]) -> list[Comparison]:
    """Every scored figure of every measured closed-loop row that has a prediction."""
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
                out.append(Comparison(m.key, f, pv, mv, band.get("lo"), band.get("hi"), role_of(p)))
    return out


@dataclass(frozen=True)
class Score:
    n: int
    within: int
    worst: Comparison | None


def score(cs: Sequence[Comparison]) -> Score:
    worst = max(cs, key=lambda c: abs(math.log(c.ratio)) if 0 < c.ratio < math.inf else math.inf, default=None)
    return Score(len(cs), sum(c.within for c in cs), worst)


# ---------------------------------------------------------------------------------------------
# markdown pieces


def fmt(figure: str, value: float) -> str:
    return "N/A" if not math.isfinite(value) else COLUMNS[figure][1].format(value)


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
    return (f"{role} rows: {s.within} of {s.n} figures within ±{WITHIN:.0%} of measured; the furthest is "
            f"{COLUMNS[w.figure][0]} at {w.key.label} (predicted {fmt(w.figure, w.predicted)}, measured "
            f"{fmt(w.figure, w.measured)}, ratio {w.ratio:.2f}).")


def cost_rows(rows: Sequence[Row], usd: float, prices: Mapping[str, float]) -> list[tuple[Row, float, dict]]:
    out = []
    for r in sorted(rows, key=lambda r: (r.key.engine, r.key.tp, r.key.batch)):
        if r.status in ("ok", "predicted") and math.isfinite(r.figures.gpu_hours_per_1m):
            dollars = r.figures.gpu_hours_per_1m * usd
            out.append((r, dollars, compare_to_api(dollars, prices)))
    return out


def cost_table(rows: Sequence[Row], usd: float, prices: Mapping[str, float]) -> str:
    names = list(prices)
    lines = ["| Config | GPU-hours per 1M | $ per 1M output tokens | " + " | ".join(f"vs {n} (${prices[n]:.2f})"
                                                                          for n in names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for r, dollars, ratios in cost_rows(rows, usd, prices):
        lines.append(f"| {r.key.label} | {r.figures.gpu_hours_per_1m:.3g} | ${dollars:,.2f} | "
                     + " | ".join(f"{ratios[n]:.2f}x" for n in names) + " |")
    return "\n".join(lines)


def cost_sentence(rows: Sequence[Row], usd: float, prices: Mapping[str, float], what: str) -> str:
    rs = cost_rows(rows, usd, prices)
    if not rs:
        return f"No {what} row has a cost."
    r, dollars, ratios = min(rs, key=lambda t: t[1])
    cheaper = [n for n, x in ratios.items() if x < 1]
    return (f"The cheapest {what} row is {r.key.label}: ${dollars:,.2f} per 1M output tokens at "
            f"${usd:.2f}/GPU-hour, " + (f"below {', '.join(cheaper)}" if cheaper else "above every listed API price")
            + f" ({', '.join(f'{x:.2f}x {n}' for n, x in ratios.items())}); this holds only at that row's "
              f"sustained load (a closed loop of {r.key.batch} requests).")


# ---------------------------------------------------------------------------------------------
# the figure (matplotlib's object API on the Agg canvas: no pyplot state, no display)


def plot_predicted_vs_measured(cs: Sequence[Comparison], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(12, 7.5), dpi=100)
    FigureCanvasAgg(fig)
    style = {"held-out": ("o", "tab:blue"), "prior": ("^", "tab:green"), "fitted": ("s", "tab:gray")}
    for i, figure in enumerate(SCORED_FIGURES):
        ax = fig.add_subplot(2, 3, i + 1)
        mine = [c for c in cs if c.figure == figure]
        for role, (marker, color) in style.items():
            pts = [c for c in mine if c.role == role]
            if pts:
                ax.scatter([c.measured for c in pts], [c.predicted for c in pts], marker=marker, color=color,
                           label=role, zorder=3)
        for c in mine:
            if c.lo is not None:
                ax.plot([c.measured, c.measured], [c.lo, c.hi], color="black", lw=0.8, alpha=0.5)
            ax.annotate(f"TP{c.key.tp} b{c.key.batch}", (c.measured, c.predicted), fontsize=7, alpha=0.7)
        _diagonal(ax, mine, log=figure != "goodput_share")
        ax.set_title(COLUMNS[figure][0], fontsize=10)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
    fig.suptitle(f"Predicted vs measured (shaded: ±{WITHIN:.0%}; bars: predicted interval)")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.07, top=0.91, wspace=0.3, hspace=0.35)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _diagonal(ax: Any, cs: Sequence[Comparison], log: bool) -> None:
    values = [v for c in cs for v in (c.measured, c.predicted) if math.isfinite(v) and (v > 0 or not log)]
    if not values:
        return
    lo, hi = (min(values) / 1.5, max(values) * 1.5) if log else (0.0, 1.05)
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * (1 - WITHIN), hi * (1 - WITHIN)], [lo * (1 + WITHIN), hi * (1 + WITHIN)],
                    color="tab:orange", alpha=0.15)
    if log:
        from matplotlib.ticker import NullFormatter, ScalarFormatter
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):      # plain numbers, not 2x10^1
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------
# calibration at report time: constants fitted on some measured rows, every row predicted again


def row_workload(pred: Row) -> RowWorkload | None:
    w = pred.provenance.get("workload", {})
    pairs = w.get("lengths") or w.get("lengths_sample")
    if not pairs:
        return None
    return RowWorkload(tuple(int(a) for a, _ in pairs), tuple(int(b) for _, b in pairs), w.get("requests_per_run"))


@dataclass(frozen=True)
class ModelInputs:
    """What re-running the model needs, from the predictions' own record (serve.model._provenance)."""
    model: ModelSpec
    hardware: str
    mem_util: float
    usd_per_gpu_hour: float
    slo: SLO
    calibration: ServeCalibration
    workloads: dict[str, RowWorkload]


def model_inputs(predicted: Sequence[Row]) -> ModelInputs | None:
    rows = [r for r in predicted if r.provenance.get("model_spec") and row_workload(r) is not None]
    if not rows:
        return None
    p = rows[0].provenance
    slo_names = {f.name for f in dataclasses.fields(SLO)}
    return ModelInputs(ModelSpec(**p["model_spec"]), p["hardware"], float(p.get("mem_util", 0.9)),
                       float(p.get("usd_per_gpu_hour", math.nan)),
                       SLO(**{k: v for k, v in p.get("slo", {}).items() if k in slo_names}),
                       calibration_from_dict(p["calibration"]) if "calibration" in p else ServeCalibration(),
                       {r.key.label: row_workload(r) for r in rows})


def explain_kwargs(mi: ModelInputs | None, calibration: ServeCalibration | None) -> dict[str, Any]:
    if mi is None:
        return {}
    w = next(iter(mi.workloads.values()))
    return {"model": mi.model, "hardware": mi.hardware, "prompt_tokens": w.prompt_tokens,
            "output_tokens": w.output_tokens, "mem_util": mi.mem_util, "calibration": calibration or mi.calibration}


@dataclass(frozen=True)
class Calibrated:
    calibration: ServeCalibration | None
    rows: tuple[Row, ...]       # every predicted key, predicted again with the fitted constants
    note: str                   # what was fitted on what, or why nothing was


def calibrate(measured: Sequence[Row], predicted: Sequence[Row]) -> Calibrated:
    """Fit the model's constants on serve.model.default_fit_labels of the measured rows (one engine: the most
    measured one) and predict every row again; the other measured rows are the held-out test."""
    mi = model_inputs(predicted)
    ok = [r for r in measured if r.status == "ok" and not open_loop(r) and mi and r.key.label in mi.workloads]
    if mi is None or len(ok) < 2:
        return Calibrated(None, (), "not fitted: needs the model's record in predictions.json and at least two "
                                    "measured closed-loop rows with predictions")
    engine = max(sorted({r.key.engine for r in ok}), key=lambda e: sum(r.key.engine == e for r in ok))
    mine = [r for r in ok if r.key.engine == engine]
    try:
        cal = fit_calibration(mine, mi.model, mi.hardware, (), (), mi.slo, mi.mem_util, prior=mi.calibration,
                              workloads=mi.workloads)
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as e:
        return Calibrated(None, (), f"not fitted: {type(e).__name__}: {e}")
    rows = tuple(predict_row(mi.model, mi.hardware, p.key, w.prompt_tokens, w.output_tokens, mi.slo, mi.mem_util,
                             mi.usd_per_gpu_hour, cal, requests_per_run=w.requests_per_run)
                 for p in predicted if p.key.engine == engine and (w := mi.workloads.get(p.key.label)))
    held = len(mine) - len(cal.fitted_on)
    return Calibrated(cal, rows, f"{cal.source}. Fitted on {', '.join(cal.fitted_on)}; {held} measured "
                                 f"{engine} row(s) held out for scoring")


@dataclass(frozen=True)
class Analysis:
    data: SweepData
    settings: Settings
    calibrated: Calibrated
    comparisons: tuple[Comparison, ...]     # the predictions made before the sweep, then the calibrated ones


def analyze(data: SweepData, api_prices: Mapping[str, float] | None = None) -> Analysis:
    cal = calibrate(data.measured, data.predicted)
    cs = comparisons(data.measured, data.predicted) + comparisons(data.measured, cal.rows)
    return Analysis(data, settings(data, api_prices), cal, tuple(cs))


def scaling_explanation(a: Analysis) -> list[str]:
    rows = list(a.data.measured) + list(a.data.predicted)
    kw = explain_kwargs(model_inputs(a.data.predicted), a.calibrated.calibration)
    return explain_scaling(rows, slo=a.settings.slo, **kw)


# ---------------------------------------------------------------------------------------------
# REPORT.md


def gpus_phrase(prov: dict) -> str:
    """"2 x NVIDIA H200" from a provenance's list of GPU names (or its single entry)."""
    gpus = find_key(prov, "gpus") or find_key(prov, "gpu")
    if isinstance(gpus, list) and gpus:
        counts = {g: gpus.count(g) for g in dict.fromkeys(map(str, gpus))}
        return ", ".join(f"{n} x {g}" for g, n in counts.items())
    return str(gpus) if gpus else "GPUs not recorded"


def engine_versions(prov: dict, engines: Sequence[str]) -> str:
    table = find_key(prov, "engine_versions")
    table = table if isinstance(table, dict) else find_key(prov, "packages") or {}
    found = [str(table[e]) for e in engines if isinstance(table, dict) and table.get(e)]
    return ", ".join(found)


def _header(data: SweepData, st: Settings) -> list[str]:
    prov = data.provenance
    versions = engine_versions(prov, st.engines)
    return [f"# Serving sweep: {st.model_name}", "",
            f"- hardware: `{st.hardware}`; GPUs recorded: {gpus_phrase(prov)}",
            f"- engine: {', '.join(st.engines) or 'none'}" + (f" ({versions})" if versions else ""),
            f"- git: {find_key(prov, 'git_sha') or 'not recorded'}; command: `{find_key(prov, 'command') or '—'}`",
            f"- SLO: TTFT <= {st.slo.ttft_s:g} s and each request's p{st.slo.itl_quantile * 100:g} gap <= "
            f"{st.slo.itl_s * 1e3:g} ms", ""]


def _interval_how(rows: Sequence[Row]) -> str:
    how = next((r.provenance.get("interval") for r in rows if r.provenance.get("interval")), None)
    return f"Intervals: {how}." if how else ""


def _comparison_md(a: Analysis) -> list[str]:
    prior = [c for c in a.comparisons if c.role == "prior"]
    fitted = [c for c in a.comparisons if c.role != "prior"]
    lines = ["## Predicted vs measured", "", "### Predicted before the sweep", ""]
    if prior:
        lines += [score_sentence(prior, "prior"), _interval_how(a.data.predicted), "", comparison_table(prior), ""]
    else:
        lines += ["No measured row has a prediction made before the sweep.", ""]
    lines += ["### Calibrated on some measured rows, scored on the others", "", f"Calibration: {a.calibrated.note}.",
              ""]
    if fitted:
        lines += [s for s in (score_sentence(fitted, r) for r in ("held-out", "fitted")) if s]
        lines += [_interval_how(a.calibrated.rows), "", comparison_table(fitted), ""]
    return lines + ["![predicted vs measured](figures/predicted_vs_measured.png)", ""]


def render_report(a: Analysis) -> str:
    data, st = a.data, a.settings
    lines = _header(data, st) + ["## Measured table", ""]
    lines += [data.table_md.strip() if data.table_md else render_table(data.measured), ""]
    lines += _comparison_md(a)
    lines += ["## Where scaling breaks", ""] + [f"- {s}" for s in scaling_explanation(a)] + [""]
    lines += ["## Cost per 1M output tokens", "",
              f"At ${st.usd_per_gpu_hour:.2f} per GPU-hour ({st.usd_source}); API prices are the configured "
              "table (illustrative unless the config sets real ones).", "",
              cost_table(data.measured, st.usd_per_gpu_hour, st.api_prices), "",
              cost_sentence(data.measured, st.usd_per_gpu_hour, st.api_prices, "measured"), ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path, api_prices: Mapping[str, float] | None = None) -> Path:
    """REPORT.md, figures/predicted_vs_measured.png and predictions_calibrated.json of one sweep folder, from
    its files alone."""
    a = analyze(load_sweep(run_dir), api_prices)
    folder = a.data.run_dir
    if a.calibrated.rows:
        write_json(folder / "predictions_calibrated.json", {"calibration": a.calibrated.calibration.to_dict(),
                                                            "rows": [r.to_dict() for r in a.calibrated.rows]})
    plot_predicted_vs_measured(a.comparisons, folder / "figures" / "predicted_vs_measured.png")
    out = folder / "REPORT.md"
    out.write_text(render_report(a))
    return out


# ---------------------------------------------------------------------------------------------
# docs/serve.md from one or more sweep folders


def _workload_phrase(data: SweepData) -> str:
    w = next((r.provenance["workload"] for r in data.predicted if "workload" in r.provenance), None)
    if not w:
        return "workload not recorded"
    runs = f", in runs of {w['requests_per_run']}" if w.get("requests_per_run") else ""
    return (f"per row {w['requests']} requests{runs}, mean prompt {w['prompt_mean']:.0f} and mean output "
            f"{w['output_mean']:.0f} tokens")


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


def _coverage(cs: Sequence[Comparison]) -> str:
    inside = [c for c in cs if c.scored and c.in_interval is not None]
    if not inside:
        return ""
    return (f"The measured value falls inside the predicted interval for {sum(bool(c.in_interval) for c in inside)} "
            f"of {len(inside)} scored figures.")


def _predicted_md(analyses: Sequence[Analysis]) -> list[str]:
    lines = ["## Predicted vs measured", "",
             "Each sweep wrote its predictions (model priors) before it measured; the report then fits the model's "
             "constants on a few measured rows and predicts again. Fitted rows are not evidence: the counts below "
             "are over the rest.", ""]
    for a in analyses:
        prior = [c for c in a.comparisons if c.role == "prior"]
        later = [c for c in a.comparisons if c.role != "prior"]
        lines += [f"### `{a.data.run_dir.name}`", ""]
        for title, cs in (("Before the sweep (priors)", prior), ("Calibrated, held-out rows", later)):
            if any(c.scored for c in cs):
                lines += [f"{title}: " + " ".join(s for s in (score_sentence(cs, r) for r in ("prior", "held-out"))
                                                  if s) + " " + _coverage(cs), "", ratio_summary(cs), ""]
        if a.calibrated.calibration is not None:
            lines += [f"Calibration: {a.calibrated.note}.", ""]
    return lines


def _explain_md(analyses: Sequence[Analysis]) -> tuple[list[str], list[str]]:
    tp, slo = ["## Where TP scaling breaks", ""], ["## Which SLO breaks first", ""]
    for a in analyses:
        d, st = a.data, a.settings
        rows = list(d.measured) + list(d.predicted)
        kw = explain_kwargs(model_inputs(d.predicted), a.calibrated.calibration)
        tp += [f"`{d.run_dir.name}`:", ""] + [f"- {s}" for s in tp_scaling_explanation(rows, **kw)] + [""]
        slo += [f"`{d.run_dir.name}` (SLO: TTFT <= {st.slo.ttft_s:g} s, p{st.slo.itl_quantile * 100:g} gap <= "
                f"{st.slo.itl_s * 1e3:g} ms):", ""]
        slo += [f"- {s}" for s in slo_explanation(rows, slo=st.slo, **kw)] + [""]
    return tp, slo


def _cost_md(analyses: Sequence[Analysis]) -> list[str]:
    lines = ["## $ per 1M output tokens vs a rented API", ""]
    for a in analyses:
        st = a.settings
        lines.append(f"- `{a.data.run_dir.name}`: " + cost_sentence(a.data.measured, st.usd_per_gpu_hour,
                                                                     st.api_prices, "measured"))
    prices = analyses[0].settings.api_prices if analyses else {}
    lines += ["", "API prices used (" + ", ".join(f"{n} ${p:.2f}" for n, p in prices.items()) + " per 1M output "
              "tokens) are the configured table; the defaults in serve.metrics are illustrative, not quotes. A GPU "
              "bills by the hour whether or not it is busy: the self-hosted figure assumes the row's load is "
              "sustained.", ""]
    return lines


def _not_measured_md(analyses: Sequence[Analysis]) -> list[str]:
    ok = [r for a in analyses for r in a.data.measured if r.status == "ok" and not open_loop(r)]
    lines = ["## What was not measured", ""]
    widest = max((r.key.tp for r in ok), default=0)
    missing = [tp for tp in TP_LADDER if tp not in {r.key.tp for r in ok}]
    if missing:
        predicted = sorted({r.key.tp for a in analyses for r in a.data.predicted if r.status == "predicted"}
                           & set(missing))
        lines.append(f"- TP={', TP='.join(map(str, missing))}: no measured row; an instance needs as many GPUs as its "
                     f"TP (the widest measured here: {widest or 'none'})."
                     + (f" Predictions exist for TP={', TP='.join(map(str, predicted))}." if predicted else ""))
    for engine in KNOWN_ENGINES:
        if not any(r.key.engine == engine for r in ok):
            lines.append(f"- {engine}: no measured row; its scheduler limits in the model are assumed "
                         f"(serve.fit.ENGINE_LIMITS), untested against a real {engine} server.")
    for a in analyses:
        lines += [f"- `{a.data.run_dir.name}` {r.key.label} failed: {r.note.splitlines()[0] if r.note else ''}"
                  for r in a.data.measured if r.status == "failed"]
    return lines + [""]


def docs_markdown(analyses: Sequence[Analysis]) -> str:
    n_ok = sum(r.status == "ok" for a in analyses for r in a.data.measured)
    n_pred = sum(r.status == "predicted" for a in analyses for r in a.data.predicted)
    tp, slo = _explain_md(analyses)
    lines = ["# Serving: the scaling table, predicted then measured", "",
             f"_Generated by `scalelab.serve.report.render_docs` from {len(analyses)} sweep folder(s): "
             f"{', '.join(f'`{a.data.run_dir}`' for a in analyses)}. Regenerate it rather than editing it._", "",
             "Before a sweep starts, an analytic model (serve/model.py: roofline step time of Pope et al. 2022, two "
             "all-reduces per layer after Shoeybi et al. 2019, continuous batching with chunked prefill after Kwon "
             "et al. 2023 and Agrawal et al. 2024, and a fixed per-step overhead) predicts every row; the sweep then "
             f"measures them with a closed-loop load. These folders hold {n_ok} measured rows and {n_pred} "
             "predicted ones.", ""]
    lines += _where_md(analyses) + _predicted_md(analyses) + tp + slo + _cost_md(analyses)
    lines += _not_measured_md(analyses)
    return "\n".join(lines)


def render_docs(run_dirs: Sequence[str | Path], out: str | Path,
                api_prices: Mapping[str, float] | None = None) -> Path:
    """docs/serve.md (or `out`) from the sweep folders' files alone."""
    if not run_dirs:
        raise ValueError("render_docs: no sweep folder given")
    analyses = [analyze(load_sweep(d), api_prices) for d in run_dirs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(docs_markdown(analyses))
    return out
