"""Figure helpers shared by the GRPO report, the studies and the docs, on core.figures (matplotlib's object API on
the Agg canvas; PNGs saved without the version tag, so the same data gives the same bytes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scalelab.core import figures

PHASE_COLORS = {"rollout": "tab:blue", "reward": "tab:orange", "reference": "tab:green", "old_logprob": "tab:olive",
                "update": "tab:red", "weight_sync": "tab:purple", "eval": "tab:cyan", "other": "tab:gray"}


def figure(rows: int = 1, cols: int = 1, height_in: float = 4.2, width_in: float = 8.0) -> tuple[Any, list]:
    return figures.axes(rows, cols, width_in=width_in, height_in=height_in, dpi=110)


def finish(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    figures.label(ax, xlabel, ylabel, title, legend_fontsize=8)


def save(fig: Any, path: Path) -> Path:
    return figures.save(fig, path)


def length_histograms(ax: Any, before: np.ndarray, after: np.ndarray, labels: tuple[str, str]) -> None:
    """Two overlaid density histograms on shared integer-width bins (lengths are token counts)."""
    both = np.concatenate([before, after])
    lo, hi = float(both.min()), float(both.max())
    bins = np.arange(np.floor(lo), np.ceil(hi) + 2) - 0.5 if hi - lo <= 60 else np.linspace(lo, hi, 31)
    ax.hist(before, bins=bins, alpha=0.5, density=True, label=labels[0])
    ax.hist(after, bins=bins, alpha=0.5, density=True, label=labels[1])
