"""Figures of the scaling table: throughput against latency per TP, and SLO attainment against load; and the
report's predicted-against-measured figure.

Each line is one (engine, TP) instance; its points are the batch sizes (closed loop) or request rates
(open loop). Only measured ("ok") rows are drawn; N/A and failed rows are in the table's footnotes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from scalelab.core.pngsave import save_png
from scalelab.serve.compare import COLUMNS, ROLE_NAMES, WITHIN, Comparison
from scalelab.serve.model import SCORED_FIGURES
from scalelab.serve.rows import Row
from scalelab.serve.table import TableHeader, rate_rps


def _lines(rows: Sequence[Row], rate: bool) -> dict[str, list[Row]]:
    """'vllm TP=2' -> its ok rows in load order, closed-loop rows or open-loop rows only."""
    out: dict[str, list[Row]] = {}
    for r in rows:
        if r.status == "ok" and (rate_rps(r) is not None) == rate:
            out.setdefault(f"{r.key.engine} TP={r.key.tp}", []).append(r)
    for rs in out.values():
        rs.sort(key=lambda r: rate_rps(r) or r.key.batch)
    return out


def _load_label(r: Row) -> str:
    rate = rate_rps(r)
    return f"b={r.key.batch}" if rate is None else f"{rate:g}/s"


def new_figure(width_in: float, dpi: int = 120):
    # matplotlib's object API on the Agg canvas: no pyplot global state, no display needed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width_in, 4.2), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def throughput_vs_latency(lines: dict[str, list[Row]], head: TableHeader, out: Path) -> Path:
    """Left: throughput vs median TTFT; right: vs median ITL. Up and left is better."""
    fig = new_figure(11)
    axes = fig.subplots(1, 2)
    for ax, attr, xlabel in ((axes[0], "ttft_p50_ms", "p50 TTFT (ms)"), (axes[1], "itl_p50_ms", "p50 ITL (ms)")):
        for name, rs in lines.items():
            xs, ys = [getattr(r.figures, attr) for r in rs], [r.figures.throughput_tok_s for r in rs]
            ax.plot(xs, ys, marker="o", label=name)
            for r, x, y in zip(rs, xs, ys):
                ax.annotate(_load_label(r), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (output tok/s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{head.model} on {head.hardware_name}: throughput vs latency per TP")
    fig.tight_layout()
    save_png(fig, out)
    return out


def slo_attainment(lines: dict[str, list[Row]], head: TableHeader, rate: bool, out: Path) -> Path:
    fig = new_figure(6)
    ax = fig.add_subplot(1, 1, 1)
    ticks: set[float] = set()
    for name, rs in lines.items():
        xs = [rate_rps(r) if rate else r.key.batch for r in rs]
        ticks.update(xs)
        ax.plot(xs, [100 * r.figures.goodput_share for r in rs], marker="o", label=name)
    ax.set_xscale("log", base=2)  # batch sizes and rates in a sweep grow geometrically
    ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
    ax.minorticks_off()
    ax.set_xlabel("request rate (req/s)" if rate else "batch (max concurrent requests)")
    ax.set_ylabel("requests meeting the SLO (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(f"{head.model} on {head.hardware_name}\nSLO: TTFT ≤ {head.slo_ttft_s:g} s, "
                 f"p99 ITL ≤ {head.slo_itl_s * 1000:g} ms per request", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out)
    return out


def write_plots(figures_dir: Path, rows: Sequence[Row], head: TableHeader) -> list[Path]:
    """The figures that have something to draw; [] when no row was measured."""
    paths = []
    closed, rate = _lines(rows, rate=False), _lines(rows, rate=True)
    if closed:
        paths.append(throughput_vs_latency(closed, head, figures_dir / "throughput_vs_latency.png"))
        paths.append(slo_attainment(closed, head, False, figures_dir / "slo_attainment_vs_batch.png"))
    if rate:
        paths.append(slo_attainment(rate, head, True, figures_dir / "slo_attainment_vs_rate.png"))
    return paths


# ---------------------------------------------------------------------------------------------
# predicted vs measured (the report's figure)


def plot_predicted_vs_measured(cs: Sequence[Comparison], path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only when a figure is drawn
    from matplotlib.figure import Figure
    fig = Figure(figsize=(12, 7.5), dpi=100)
    FigureCanvasAgg(fig)
    style = {"prior": ("^", "tab:green"), "prior-late": ("v", "tab:olive"), "rerun": ("D", "tab:purple"),
             "held-out": ("o", "tab:blue"), "fitted": ("s", "tab:gray")}
    for i, figure in enumerate(SCORED_FIGURES):
        ax = fig.add_subplot(2, 3, i + 1)
        mine = [c for c in cs if c.figure == figure]
        for role, (marker, color) in style.items():
            pts = [c for c in mine if c.role == role]
            if pts:
                ax.scatter([c.measured for c in pts], [c.predicted for c in pts], marker=marker, color=color,
                           label=ROLE_NAMES[role], zorder=3)
        for c in mine:
            if c.lo is not None:
                ax.plot([c.measured, c.measured], [c.lo, c.hi], color="black", lw=0.8, alpha=0.5)
            ax.annotate(f"TP{c.key.tp} b{c.key.batch}", (c.measured, c.predicted), fontsize=7, alpha=0.7)
        _diagonal(ax, mine, log=figure != "goodput_share")
        ax.set_title(COLUMNS[figure][0], fontsize=10)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
    handles = {label: h for ax in fig.axes for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:      # one legend for the six panels
        fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.955),
                   fontsize=8, ncol=len(handles), frameon=False)
    fig.suptitle(f"Predicted vs measured (shaded: ±{WITHIN:.0%}; bars: predicted interval)")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.07, top=0.88, wspace=0.3, hspace=0.35)
    save_png(fig, path)
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
        from matplotlib.ticker import NullFormatter, ScalarFormatter  # lazy: matplotlib only when a figure is drawn
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):      # plain numbers, not 2x10^1
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)


def plot_open_loop(ladders: dict[tuple[str, int], list[Any]], slo: Any, path: Path) -> Path:
    """Open-loop Poisson ladders against their predictions (serve.openloop.poisson_ladders): goodput share,
    p50/p99 TTFT and p50/p99 ITL against the offered rate; measured solid, predicted dashed, the SLO dotted."""
    fig = new_figure(13.0, dpi=100)  # three panels of a few lines each: 1,300 px wide is legible, and a third smaller
    panels = (("goodput share", (("goodput_share", "o"),), slo.attainment),
              ("TTFT (ms)", (("ttft_p50_ms", "s"), ("ttft_p99_ms", "o")), slo.ttft_s * 1e3),
              ("ITL (ms)", (("itl_p50_ms", "s"), ("itl_p99_ms", "o")), slo.itl_s * 1e3))
    for i, (title, figures, limit) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        for n, ((engine, tp), ps) in enumerate(ladders.items()):
            name, color = f"{engine} TP={tp}", f"C{n}"
            for figure, marker in figures:
                x = [p.rate_rps for p in ps]
                short = figure.split("_")[1] if "_p" in figure else ""
                ax.plot(x, [getattr(p.measured, figure) for p in ps], marker=marker, color=color,
                        label=f"{name} {short} measured".replace("  ", " "))
                ax.plot(x, [getattr(p.predicted, figure) for p in ps], marker=marker, color=color, ls="--",
                        alpha=0.6, label=f"{name} {short} predicted".replace("  ", " "))
        ax.axhline(limit, color="black", ls=":", lw=1)
        if i > 0:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("offered rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("Open loop, Poisson arrivals: measured (solid) and predicted before the run (dashed); "
                 "dotted: the SLO", fontsize=10)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.88, wspace=0.25)
    save_png(fig, path)
    return path
