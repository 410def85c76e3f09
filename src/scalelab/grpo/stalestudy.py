"""The staleness ablation: one config, one seed, one run per staleness k (rollout.staleness), optionally with the
truncated importance-sampling correction (loss.is_correction) as extra variants; then curves side by side and
a table of each k's final numbers, held-out pass@1 included.

    <out_dir>/<name>/k<k>/, k<k>-is/       run folders (study.py: finished ones are skipped)
    <out_dir>/<name>/staleness.json, .md   collect(...) per run, render_markdown(...)
    <out_dir>/<name>/figures/staleness_{curves,final}.png

What k costs is off-policyness: the batch of step t was sampled by the weights of step t - k, measured per step
as the k3 divergence between the behaviour log-probs and the current policy's (`behavior_mismatch_k3`). What it
buys is overlap: with rollout on other devices a step would take max(rollout, rest) (`overlapped_step_ms`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from scalelab.core.numfmt import num
from scalelab.core.rundir import RunDir
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.plots import figure, finish, save
from scalelab.grpo.report import quarter_means
from scalelab.grpo.steps import read_steps
from scalelab.grpo.study import Trainer, Variant, run_variants, study_dir, write_study_json

SERIES = (("reward_mean", "mean reward"), ("loss", "loss"), ("kl_mean", "KL to reference (k3, nats/token)"),
          ("behavior_mismatch_k3", "behaviour vs current policy (k3, nats/token)"))


def staleness_variants(ks: Sequence[int], is_correction: bool | Sequence[int] = False,
                       heldout: bool = True) -> list[Variant]:
    """k<k> without correction for every k; k<k>-is with it for every k > 0 when `is_correction` is True, or for
    the k it lists (e.g. only the staler 4 and 8, where the correction has something to correct)."""
    ev = ("eval.at_end=true",) if heldout else ()
    out = [Variant(f"k{k}", (f"rollout.staleness={k}", "loss.is_correction=false", *ev)) for k in ks]
    corrected = [k for k in ks if k > 0] if is_correction is True else list(is_correction or [])
    out += [Variant(f"k{k}-is", (f"rollout.staleness={k}", "loss.is_correction=true", *ev)) for k in corrected
            if k > 0]
    return out


def heldout_headline(summary: dict | None) -> dict | None:
    """The held-out metric a study compares: greedy pass@1 when measured, else sampled; in points."""
    if not summary:
        return None
    key = "greedy_pass1" if summary.get("greedy_pass1") else "sampled_pass1"
    x = summary.get(key)
    if not x:
        return None
    return {"metric": key, **{k: 100.0 * x[k] for k in ("base", "trained", "delta", "ci_low", "ci_high")}}


def collect(run_dir: Path) -> dict:
    """One variant's curves and final numbers, from its run folder alone."""
    rd = RunDir(run_dir)
    cfg = load_grpo_config(rd.config_path)
    steps = read_steps(rd.path)
    results = rd.read_optional("results.json") or {}
    series = {k: [float(getattr(s, k)) for s in steps] for k, _ in SERIES}
    q = lambda k: quarter_means(series[k])[1]  # noqa: E731
    return {"name": rd.path.name, "k": cfg.rollout.staleness, "is_correction": cfg.loss.is_correction,
            "run_dir": str(rd.path), "steps": [s.step for s in steps], "series": series,
            "final": {"reward_first_quarter": quarter_means(series["reward_mean"])[0],
                      "reward_last_quarter": q("reward_mean"), "kl_last_quarter": q("kl_mean"),
                      "mismatch_last_quarter": q("behavior_mismatch_k3"),
                      "median_step_ms": results.get("median_step_ms"),
                      "median_overlapped_step_ms": results.get("median_overlapped_step_ms"),
                      "heldout": heldout_headline(rd.read_optional("eval/summary.json"))}}


def render_markdown(rows: Sequence[dict], name: str) -> str:
    table = []
    for r in rows:
        f, h = r["final"], r["final"]["heldout"]
        held = "not measured" if h is None else f"{h['trained']:.1f} ({h['delta']:+.1f}; {h['ci_low']:+.1f} to " \
                                                f"{h['ci_high']:+.1f})"
        table.append(f"| {r['name']} | {r['k']} | {'yes' if r['is_correction'] else 'no'} | {len(r['steps'])} | "
                     f"{f['reward_first_quarter']:.3f} -> {f['reward_last_quarter']:.3f} | "
                     f"{f['mismatch_last_quarter']:.2e} | {f['kl_last_quarter']:.2e} | "
                     f"{num(f['median_step_ms'], '{:,.0f}')} | {num(f['median_overlapped_step_ms'], '{:,.0f}')} | "
                     f"{held} |")
    metric = next((r["final"]["heldout"]["metric"] for r in rows if r["final"]["heldout"]), "held-out pass@1")
    return "\n".join([
        f"# Staleness ablation: {name}", "",
        "Same config, seed and data; only rollout.staleness k (and the IS correction) differ. Mismatch = k3 "
        "divergence of the behaviour policy from the current one (last quarter); step ms = measured median; "
        "overlapped = max(rollout, rest), the step time with rollout on other devices.", "",
        f"| variant | k | IS | steps | reward first -> last quarter | mismatch | KL to ref | step ms | overlapped "
        f"ms | held-out {metric.replace('_', ' ')} % (gain; CI) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|", *table, "",
        "![curves](figures/staleness_curves.png)", "", "![final](figures/staleness_final.png)", ""])


def plot_curves(rows: Sequence[dict], path: Path) -> Path:
    fig, axes = figure(rows=2, cols=2, height_in=3.6, width_in=11.0)
    for ax, (key, label) in zip(axes, SERIES):
        for r in rows:
            ax.plot(r["steps"], r["series"][key], lw=1.2, ls="--" if r["is_correction"] else "-", label=r["name"])
        finish(ax, "step", label, label)
    return save(fig, path)


def plot_final(rows: Sequence[dict], path: Path) -> Path:
    fig, (ax,) = figure(height_in=3.8)
    names = [r["name"] for r in rows]
    held = [r["final"]["heldout"] for r in rows]
    if any(held):
        vals = [h["trained"] if h else np.nan for h in held]
        err = np.array([[h["delta"] - h["ci_low"], h["ci_high"] - h["delta"]] if h else [0, 0] for h in held]).T
        ax.bar(names, vals, yerr=err, capsize=4, color="tab:blue", label="trained (bars: CI of the gain)")
        base = next(h["base"] for h in held if h)
        ax.axhline(base, color="black", ls="--", label=f"base {base:.1f}%")
        finish(ax, "variant", "held-out pass@1 (%)", "final held-out pass@1 per staleness")
    else:
        ax.bar(names, [r["final"]["reward_last_quarter"] for r in rows], color="tab:orange")
        finish(ax, "variant", "mean reward, last quarter", "final train reward per staleness (no held-out eval)")
    return save(fig, path)


def staleness_study(config: str | Path | None, overrides: Sequence[str], ks: Sequence[int],
                    is_correction: bool | Sequence[int] = False, heldout: bool = True, trainer: Trainer | None = None,
                    isolate: bool = False, log: Callable[[str], None] = print, jobs: int = 1) -> Path:
    """Train (or skip) every variant, then write staleness.json/.md and the figures; returns staleness.md."""
    runs = run_variants(config, overrides, staleness_variants(ks, is_correction, heldout), trainer, isolate, log,
                        jobs)
    rows = [collect(r.run_dir) for r in runs]
    cfg = load_grpo_config(config, overrides)
    where = study_dir(cfg)
    write_study_json(where / "staleness.json", {"name": cfg.run.name, "variants": rows})
    plot_curves(rows, where / "figures" / "staleness_curves.png")
    plot_final(rows, where / "figures" / "staleness_final.png")
    out = where / "staleness.md"
    out.write_text(render_markdown(rows, cfg.run.name))
    return out
