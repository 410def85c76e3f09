"""The real-model GRPO runs as docs blocks (docs_blocks.BlockKind), each reading run folders as `grpo train`,
`grpo eval` and `evals battery` leave them (config.toml, metrics.jsonl, eval/summary.json, battery/,
provenance.json; any of them stored compressed or as a .same pointer):

    recipe_runs   (folder, base_battery)  one row per recipe-* run below `folder`: settings, work done, held-out
                                          scores before -> after with their paired intervals, and the run's
                                          battery paired with the base model's (found below `base_battery`)
    recipe_curves (folder)                the recipe runs' per-step curves: a figure and a table of first/last steps
    collapse      (shipped, defended)     two runs of one config side by side at steps 0, 1, 2 and the last
    real_steps    (folder)                each recipe run's median phase times and micro-batching
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from scalelab.core.jsonio import find_stored, is_stored, iter_jsonl, read_json, read_text
from scalelab.core.numfmt import DASH, pct, points
from scalelab.evals.battery_records import BatteryFolder, read_items
from scalelab.grpo.curve import read_curve
from scalelab.grpo.docs_blocks import NOT_MEASURED, BlockKind, Inputs
from scalelab.grpo.passk import PairedDelta, paired_bootstrap
from scalelab.grpo.plots import figure, finish, save

RECIPE = "recipe-"              # the run folders recipe_runs, recipe_curves and real_steps read
PAIRED_TASK = "math500"         # the battery task paired with the base model's
# `grpo eval`'s defaults (eval.bootstrap_resamples, eval.confidence, eval.data_seed): the battery's interval is
# computed as the held-out one in eval/summary.json is
RESAMPLES, CONFIDENCE, SEED = 10_000, 0.95, 0
FIRST, LAST_REWARD, LAST = 6, 6, 5  # steps averaged: the first, the last for the reward, the last for the rest
TASK_NAMES = {"gsm8k": "GSM8K", "math500": "MATH-500"}


@dataclass(frozen=True)
class Run:
    name: str
    path: Path
    config: Mapping[str, Any]               # config.toml as written: the docs read a few keys, unvalidated
    steps: tuple[Mapping[str, Any], ...]    # grpo_step events, the last per step (a resumed step), in step order
    curve: tuple[Mapping[str, Any], ...]    # heldout_curve points (eval.every), by step (grpo.curve)

    def setting(self, section: str, key: str, default: Any = None) -> Any:
        return self.config.get(section, {}).get(key, default)

    def series(self, key: str) -> list[float]:
        """The key per step; nan where a step lacks it (older records)."""
        return [math.nan if s.get(key) is None else float(s[key]) for s in self.steps]

    @property
    def order(self) -> tuple:
        return (self.setting("optim", "lr", 0.0), self.setting("rollout", "temperature", 0.0),
                self.setting("train", "seed", 0), self.name)


def read_run(path: Path) -> Run:
    events = list(iter_jsonl(path / "metrics.jsonl"))
    by_step = {int(e["step"]): e for e in events if e.get("event") == "grpo_step"}  # a resumed step: the last
    config = tomllib.loads(read_text(path / "config.toml")) if is_stored(path / "config.toml") else {}
    return Run(path.name, path, config, tuple(by_step[s] for s in sorted(by_step)), tuple(read_curve(events)))


def recipe_runs(folder: Path) -> list[Run]:
    """The recipe-* run folders, by learning rate, then rollout temperature, then seed."""
    found = [read_run(p) for p in sorted(folder.iterdir()) if p.is_dir() and p.name.startswith(RECIPE)]
    return sorted(found, key=lambda r: r.order)


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def _f(x: float, spec: str = "{:.2f}") -> str:
    return DASH if math.isnan(x) else spec.format(x)


def _sci(x: float | None) -> str:
    """A learning rate as its run names spell it: 0.0001 -> '1e-4', 1.5e-05 -> '1.5e-5'."""
    if x is None:
        return DASH
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _count(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n:,}"


def _no_runs(heading: str, inp: Inputs) -> list[str]:
    return [heading, "", f"{NOT_MEASURED}: no {RECIPE}* run folder in `{inp.label('folder')}`."]


# ---------------------------------------------------------------------------------------------
# recipe_runs


def _before_after(s: Mapping | None) -> str:
    """An eval/summary.json entry: base -> trained (+delta, CI lo to hi), in percent and points."""
    if not s:
        return "not evaluated"
    return (f"{pct(s['base'])} -> {pct(s['trained'])} ({points(s['delta'])}, {s['confidence']:.0%} CI "
            f"{points(s['ci_low'])} to {points(s['ci_high'])})")


def base_items(folder: Path, task: str) -> dict[str, float] | None:
    """id -> 1.0/0.0 of the first battery below `folder` that kept `task`'s items; None if none did."""
    found = sorted((p for p in find_stored(folder, f"{task}.jsonl") if p.parent.name == "items"),
                   key=lambda p: (len(p.parts), str(p)))
    if not found:
        return None
    return {i.id: float(i.correct) for i in read_items(BatteryFolder(found[0].parent.parent), task)}


def paired_battery(run: Run, base: Mapping[str, float], task: str = PAIRED_TASK) -> PairedDelta | None:
    """The run's battery score on `task` paired problem by problem with the base model's (the problems both
    scored, in id order); None when the run kept no battery items for it."""
    folder = BatteryFolder(run.path / "battery")
    if not is_stored(folder.items(task)):
        return None
    trained = {i.id: float(i.correct) for i in read_items(folder, task)}
    ids = sorted(set(base) & set(trained))
    if not ids:
        return None
    return paired_bootstrap([base[i] for i in ids], [trained[i] for i in ids], RESAMPLES, CONFIDENCE, SEED)


def _battery_cell(d: PairedDelta | None, n_base: int) -> str:
    if d is None:
        return "not kept"
    partial = "" if d.n == n_base else f", {d.n} paired"
    return (f"{pct(d.trained)} ({points(d.delta)}, {d.confidence:.0%} CI {points(d.ci_low)} to "
            f"{points(d.ci_high)}{partial})")


def _recipe_row(r: Run, base: Mapping[str, float] | None) -> str:
    summary = read_json(r.path / "eval" / "summary.json") if is_stored(r.path / "eval" / "summary.json") else {}
    sequences = len(r.steps) * r.setting("data", "prompts_per_step", 0) * r.setting("rollout", "group_size", 0)
    tokens = int(sum(s["generated_tokens_this_step"] for s in r.steps))
    train_s = sum(s["step_ms"] for s in r.steps) / 1e3
    battery = "no base battery" if base is None else _battery_cell(paired_battery(r, base), len(base))
    temperature = r.setting("rollout", "temperature")
    return (f"| {r.name} | {_sci(r.setting('optim', 'lr'))} | {DASH if temperature is None else f'{temperature:g}'} "
            f"| {len(r.steps)} | {sequences:,} | {_count(tokens)} | {train_s:,.0f} | "
            f"{_before_after(summary.get('greedy_pass1'))} | {_before_after(summary.get('greedy_strict_pass1'))} | "
            f"{battery} |")


def _held_out_name(runs: Sequence[Run]) -> str:
    """'GSM8K test (1,319)' from the first eval/summary.json found."""
    for r in runs:
        if is_stored(r.path / "eval" / "summary.json"):
            s = read_json(r.path / "eval" / "summary.json")
            return f"{TASK_NAMES.get(s['task'], s['task'])} {s['split']} ({s['n_examples']:,})"
    return "held-out"


def _recipe_runs(inp: Inputs) -> list[str]:
    runs = recipe_runs(inp.path("folder"))
    if not runs:
        return _no_runs(RECIPE_RUNS.heading, inp)
    base = base_items(inp.path("base_battery"), PAIRED_TASK)
    task = TASK_NAMES.get(PAIRED_TASK, PAIRED_TASK)
    against = "no base battery" if base is None else f"paired vs base {pct(float(np.mean(list(base.values()))))}"
    return [RECIPE_RUNS.heading, "",
            f"| run | lr | T | steps | sequences | rollout tokens | training s | {_held_out_name(runs)} lenient, "
            f"greedy | strict | {task} after training ({against}) |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|---|", *(_recipe_row(r, base) for r in runs), "",
            f"Each run's folder in `{inp.label('folder')}`. Sequences = steps x prompts per step x group size; "
            "rollout tokens = the sum of generated_tokens_this_step over the steps; training s = the sum of the "
            "steps' step_ms (the GPU-seconds of training: start-up and evaluations are not in it). Held-out: "
            "eval/summary.json (`scalelab grpo eval`: the base and the trained policy, greedy, on the same "
            "problems), its paired bootstrap interval of trained - base. "
            f"{task}: the run's battery/ paired problem by problem with the base model's battery below "
            f"`{inp.label('base_battery')}`, paired bootstrap over the problems ({RESAMPLES:,} resamples, seed "
            f"{SEED}); 'not kept' where the run has no {task} items."]


RECIPE_RUNS = BlockKind("recipe_runs", "### The recipe's runs", ("folder", "base_battery"), _recipe_runs)


# ---------------------------------------------------------------------------------------------
# recipe_curves

CURVES = (("reward/correctness", "sampled correctness (T = rollout)"), ("kl_mean", "KL to the base (k3)"),
          ("entropy_mean", "entropy (nats/token)"), ("len_mean", "mean completion length (tokens)"))


def held_out_points(r: Run) -> list[tuple[int, float]]:
    """The run's held-out curve as (step, greedy pass@1 %), step 0 included, when it has a point after step 0;
    else none. The curve's subset (eval.curve_limit) is not the end-of-run evaluation's set: the two never mix."""
    points = [(int(e["step"]), 100 * float(e["greedy_pass1"])) for e in r.curve]
    return points if any(step > 0 for step, _ in points) else []


def plot_curves(runs: Sequence[Run], path: Path) -> Path:
    held = any(held_out_points(r) for r in runs)
    fig, axes = figure(rows=3 if held else 2, cols=2, height_in=3.0, width_in=11.0)
    for ax, (key, label) in zip(axes, CURVES):
        for r in runs:
            ax.plot([s["step"] for s in r.steps], r.series(key), lw=1.2, label=r.name)
        finish(ax, "step", label, label)
    if held:
        ax = axes[len(CURVES)]
        for r in runs:
            points = held_out_points(r)
            ax.plot([x for x, _ in points], [y for _, y in points], "o-", label=r.name)
        finish(ax, "step", "held-out greedy pass@1 (%)", "held-out greedy pass@1")
        axes[-1].set_visible(False)
    return save(fig, path)


def _curve_row(r: Run) -> str:
    reward, entropy = r.series("reward/correctness"), r.series("entropy_mean")
    return (f"| {r.name} | {_f(_mean(reward[:FIRST]))} -> {_f(_mean(reward[-LAST_REWARD:]))} | "
            f"{_f(_mean(r.series('kl_mean')[-LAST:]))} | {_f(_mean(entropy[-LAST:]))} (from "
            f"{_f(_mean(entropy[:FIRST]))}) | {_f(_mean(r.series('finished_frac')[-LAST:]))} |")


def _recipe_curves(inp: Inputs) -> list[str]:
    runs = [r for r in recipe_runs(inp.path("folder")) if r.steps]
    if not runs:
        return _no_runs(RECIPE_CURVES.heading, inp)
    fig = plot_curves(runs, inp.figure("grpo_recipe_curves"))
    return [RECIPE_CURVES.heading, "", inp.image(fig, "the recipe runs per step"), "",
            f"| run | sampled correctness, first {FIRST} -> last {LAST_REWARD} steps | KL to the base, last {LAST} | "
            f"entropy, last {LAST} (first {FIRST}) | finished (stop token), last {LAST} |",
            "|---|---|---:|---:|---:|", *(_curve_row(r) for r in runs), "",
            "Means over steps of each run's metrics.jsonl; sampled correctness is the mean correctness reward of "
            "the step's rollouts (training prompts, the rollout temperature)."]


RECIPE_CURVES = BlockKind("recipe_curves", "### The recipe's runs, step by step", ("folder",), _recipe_curves)


# ---------------------------------------------------------------------------------------------
# collapse

COLLAPSE_STEPS = (0, 1, 2)      # and the last: how fast the two runs part, and where they end


def _format_key(r: Run) -> str | None:
    """The run's format reward (reward/format, reward/format_gated, ...): whichever its steps log."""
    keys = sorted(k for s in r.steps[:1] for k in s if k.startswith("reward/format"))
    return keys[0] if keys else None


def _length(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _collapse_cells(r: Run, step: int) -> str:
    s = next((s for s in r.steps if s["step"] == step), None)
    if s is None:
        return f"{DASH} | {DASH}"
    fmt = _format_key(r)
    spread = "/".join(f"{s[k]:.0f}" for k in ("len_p10", "len_p50", "len_p90"))
    return (f"{_length(s['len_mean'])} ({spread}) | {s['reward/correctness']:.3f} / "
            f"{DASH if fmt is None else f'{s[fmt]:.3f}'}")


def plot_collapse(runs: Sequence[tuple[str, Run]], path: Path) -> Path:
    fig, axes = figure(rows=1, cols=2, height_in=3.6, width_in=11.0)
    for ax, (key, label) in zip(axes, (("len_mean", "mean completion length (tokens)"),
                                       ("reward/correctness", "correctness reward"))):
        for role, r in runs:
            ax.plot([s["step"] for s in r.steps], r.series(key), "o-", lw=1.2, label=f"{role}: {r.name}")
        finish(ax, "step", label, label)
    return save(fig, path)


def _rewards(r: Run) -> str:
    names, weights = r.setting("data", "rewards", []), r.setting("data", "reward_weights", [])
    return " + ".join(f"{w:g} x {n}" for n, w in zip(names, weights)) or DASH


def _collapse(inp: Inputs) -> list[str]:
    runs = [("shipped", read_run(inp.path("shipped"))), ("defended", read_run(inp.path("defended")))]
    empty = [inp.label(role) for role, r in runs if not r.steps]
    if empty:
        return [COLLAPSE.heading, "", f"{NOT_MEASURED}: no steps in " + " and ".join(f"`{e}`" for e in empty) + "."]
    last = max(s["step"] for _, r in runs for s in r.steps)
    rows = [f"| {step} | " + " | ".join(_collapse_cells(r, step) for _, r in runs) + " |"
            for step in sorted({*COLLAPSE_STEPS, last})]
    kl = "; ".join(f"{role} {r.steps[-1]['kl_mean']:.2f} (step {r.steps[-1]['step']})" for role, r in runs)
    fig = plot_collapse(runs, inp.figure("grpo_collapse"))
    return [COLLAPSE.heading, "",
            "; ".join(f"{role}: `{inp.label(role)}` (reward {_rewards(r)})" for role, r in runs) + ".", "",
            "| step | shipped: mean length (p10/p50/p90) | shipped: correctness / format | defended: mean length "
            "(p10/p50/p90) | defended: correctness / format |", "|---:|---|---|---|---|", *rows, "",
            f"KL to the start at the last step: {kl}.", "", inp.image(fig, "the two runs per step")]


COLLAPSE = BlockKind("collapse", "### The collapse, step by step", ("shipped", "defended"), _collapse)


# ---------------------------------------------------------------------------------------------
# real_steps

PHASES = ("step_ms", "rollout_ms", "reference_ms", "update_ms", "weight_sync_ms")


def _micro_batching(r: Run) -> str:
    tokens, rows = r.setting("optim", "micro_batch_tokens", 0), r.setting("optim", "micro_batch_size")
    if tokens:
        return f"passes of <= {tokens:,} tokens"
    return DASH if rows is None else f"{rows} sequences a pass"


def _shared(r: Run) -> str | None:
    """What the run's provenance.json says ran on its GPU beside it (`shared_gpu_with`); None if it says nothing."""
    path = r.path / "provenance.json"
    others = read_json(path).get("shared_gpu_with") if is_stored(path) else None
    if not others:
        return None
    return ", ".join(others) if isinstance(others, list) else str(others)


def _real_steps(inp: Inputs) -> list[str]:
    runs = [r for r in recipe_runs(inp.path("folder")) if r.steps]
    if not runs:
        return _no_runs(REAL_STEPS.heading, inp)
    rows = [f"| {r.name} | {len(r.steps)} | " + " | ".join(f"{np.median(r.series(k)):,.0f}" for k in PHASES)
            + f" | {_micro_batching(r)} |" for r in runs]
    shared = [f"{r.name} shared its GPU with {others} (its provenance.json): its times are not those of a run "
              "alone." for r in runs if (others := _shared(r))]
    note = ["", " ".join(shared)] if shared else []
    return [REAL_STEPS.heading, "",
            "| run | steps | step ms | rollout | reference pass | update | weight sync | update micro-batches |",
            "|---|---:|---:|---:|---:|---:|---:|---|", *rows, "",
            "Medians over each run's steps (metrics.jsonl), in ms; micro-batches from its config.toml "
            "(optim.micro_batch_tokens, else optim.micro_batch_size).", *note]


REAL_STEPS = BlockKind("real_steps", "### Where a real step's time goes", ("folder",), _real_steps)

KINDS = (RECIPE_RUNS, RECIPE_CURVES, COLLAPSE, REAL_STEPS)
