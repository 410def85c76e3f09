"""Figures for write-ups: matplotlib's object API on the Agg canvas (no pyplot global state, no display), and a
save that writes the same PNG bytes for the same data on any matplotlib version (no 'Software' tag).
matplotlib is imported inside the functions: it is an optional dependency that only figure-making needs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.core.pngsave import save_png

DETERMINISTIC = {"Software": None}   # PNG metadata: without it the file names the matplotlib version


def figure(width_in: float = 7.0, height_in: float = 4.2, dpi: int = 110) -> Any:
    """An empty Figure on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional dependency: figures only
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def axes(rows: int = 1, cols: int = 1, width_in: float = 7.0, height_in: float = 4.2,
         dpi: int = 110) -> tuple[Any, list]:
    """A figure of rows x cols subplots, height_in per row, and its axes in reading order."""
    fig = figure(width_in, height_in * rows, dpi)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(rows * cols)]


def label(ax: Any, xlabel: str, ylabel: str, title: str | None = None, legend_fontsize: float | None = None,
          legend: bool = True) -> None:
    """Axis labels, optional title, a light grid, and a legend when something on the axes is labelled."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(**({} if legend_fontsize is None else {"fontsize": legend_fontsize}))


def save(fig: Any, path: Path) -> Path:
    """tight_layout, then a PNG without the version tag (its parent folder made)."""
    fig.tight_layout()
    return save_png(fig, path, metadata=DETERMINISTIC)
