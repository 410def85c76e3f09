"""Figure helpers shared by the GRPO report, the studies and the docs: matplotlib's object API on the Agg
canvas (no pyplot global state, no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

PHASE_COLORS = {"rollout": "tab:blue", "reward": "tab:orange", "reference": "tab:green", "old_logprob": "tab:olive",
                "update": "tab:red", "weight_sync": "tab:purple", "eval": "tab:cyan", "other": "tab:gray"}


def figure(rows: int = 1, cols: int = 1, height_in: float = 4.2, width_in: float = 8.0) -> tuple[Any, list]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only when a figure is drawn
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width_in, height_in * rows), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(rows * cols)]


def finish(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def length_histograms(ax: Any, before: np.ndarray, after: np.ndarray, labels: tuple[str, str]) -> None:
    """Two overlaid density histograms on shared integer-width bins (lengths are token counts)."""
    both = np.concatenate([before, after])
    lo, hi = float(both.min()), float(both.max())
    bins = np.arange(np.floor(lo), np.ceil(hi) + 2) - 0.5 if hi - lo <= 60 else np.linspace(lo, hi, 31)
    ax.hist(before, bins=bins, alpha=0.5, density=True, label=labels[0])
    ax.hist(after, bins=bins, alpha=0.5, density=True, label=labels[1])
