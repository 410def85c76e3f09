"""The serve page's one figure: every Poisson ladder on the page, measured, side by side (goodput share, p99 TTFT and
p99 ITL against the offered rate), so engines and models compare at a glance; each folder's REPORT.md keeps its
own figure with the predictions beside the measurements.

    ladder_series(analyses) -> list[Series]      the ladders among the page's open-loop folders
    plot_ladders(series, slo, path) -> Path

A ladder is a folder's Poisson (arrival CV 1) points of one engine and TP (serve.openloop.poisson_ladders: measured
rows beside their predictions) at three or more rates, in a folder that is not a rate search (its probes are chosen
by the bisection, not spread over the load).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from scalelab.core.pngsave import save_png
from scalelab.serve.openloop import poisson_ladders, read_search
from scalelab.serve.plots import new_figure

PANELS = (("goodput share", "goodput_share", "attainment", 1.0),
          ("p99 TTFT (ms)", "ttft_p99_ms", "ttft_s", 1e3),
          ("p99 ITL (ms)", "itl_p99_ms", "itl_s", 1e3))


@dataclass(frozen=True)
class Series:
    label: str                                   # the folder and its engine
    points: tuple[tuple[float, Any], ...]        # (offered rate, the row's figures) ascending


def ladder_series(analyses: Sequence[Any]) -> list[Series]:
    out = []
    for a in analyses:
        if read_search(a.data.run_dir) is not None:
            continue
        folder = f"{a.data.run_dir.parent.name}/{a.data.run_dir.name}"
        out += [Series(f"{folder} ({engine})", tuple((p.rate_rps, p.measured) for p in points))
                for (engine, _), points in poisson_ladders(a.open_points).items() if len(points) >= 3]
    return out


def plot_ladders(series: Sequence[Series], slo: Any, path: Path) -> Path:
    """Three panels against the offered rate (log axes: the 0.5B's rates reach three times the 7B's); the SLO
    dotted."""
    fig = new_figure(13.0, dpi=100)
    for i, (title, figure, limit_field, scale) in enumerate(PANELS):
        ax = fig.add_subplot(1, 3, i + 1)
        for n, s in enumerate(series):
            ax.plot([x for x, _ in s.points], [getattr(f, figure) for _, f in s.points], marker="o", ms=4,
                    color=f"C{n}", label=s.label)
        ax.axhline(getattr(slo, limit_field) * scale, color="black", ls=":", lw=1)
        ax.set_xscale("log")
        if i > 0:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("offered rate (req/s)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Every Poisson ladder on this page, measured; dotted: the SLO", fontsize=10)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.88, wspace=0.25)
    save_png(fig, path)
    return path
