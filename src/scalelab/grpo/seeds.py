"""The same config trained with several seeds: held-out pass@1 gain per seed (paired bootstrap over examples) and
across seeds (Student's t over the per-seed gains: the run, not the example, is the unit that varies).

    <out_dir>/<name>/seed<s>/            one run folder per seed (study.py), eval.at_end on
    <out_dir>/<name>/seeds.json, .md     aggregate(...) and render_markdown(...)
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from scalelab.core.jsonio import read_json
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.passk import seed_interval
from scalelab.grpo.study import Trainer, Variant, run_variants, study_dir, write_study_json

METRICS = (("greedy_pass1", "greedy pass@1"), ("sampled_pass1", "sampled pass@1"))


def seed_variants(seeds: Sequence[int]) -> list[Variant]:
    return [Variant(f"seed{s}", (f"train.seed={s}", "eval.at_end=true")) for s in seeds]


MIN_SEEDS = 3


def goal_verdict(mean: float, ci_low: float | None, n_seeds: int, goal_points: float) -> tuple[bool, str]:
    """The goal holds when the mean gain reaches it over >= 3 seeds and the t interval lies above 0: a mean
    alone over 3 noisy runs is not evidence (with 2 degrees of freedom t(0.975) = 4.30)."""
    if mean < goal_points:
        return False, f"not met: mean {mean:+.1f} < +{goal_points:g}"
    if n_seeds < MIN_SEEDS:
        return False, f"not met: {n_seeds} seed(s), the goal needs >= {MIN_SEEDS}"
    if ci_low is None or ci_low <= 0:
        return False, "not met: the mean reaches it but the interval includes 0"
    return True, f"met: mean >= +{goal_points:g} and the interval above 0"


def aggregate(per_seed: dict[int, dict], confidence: float = 0.95, goal_points: float = 5.0) -> dict:
    """`per_seed`: seed -> its eval/summary.json. Per metric: each seed's gain and interval, and the mean gain
    over seeds with its t interval; all in percentage points."""
    out: dict = {"seeds": sorted(per_seed), "goal_points": goal_points, "metrics": {}}
    for key, _ in METRICS:
        rows = {s: per_seed[s][key] for s in sorted(per_seed) if per_seed[s].get(key)}
        if not rows:
            continue
        pts = lambda x: 100.0 * x  # noqa: E731
        across = seed_interval([pts(r["delta"]) for r in rows.values()], confidence)
        out["metrics"][key] = {
            "per_seed": [{"seed": s, "base": pts(r["base"]), "trained": pts(r["trained"]), "delta": pts(r["delta"]),
                          "ci_low": pts(r["ci_low"]), "ci_high": pts(r["ci_high"])} for s, r in rows.items()],
            "across_seeds": asdict(across),
            **dict(zip(("meets_goal", "verdict"),
                       goal_verdict(across.mean, across.ci_low, across.n_seeds, goal_points)))}
    first = next(iter(per_seed.values()))
    out.update(split=first["split"], task=first["task"], task_options=first["task_options"],
               n_examples=first["n_examples"], trained_steps=first["trained_steps"])
    return out


def _interval(lo: float | None, hi: float | None) -> str:
    return "— (one seed)" if lo is None else f"{lo:+.1f} to {hi:+.1f}"


def render_markdown(agg: dict, name: str) -> str:
    lines = [f"# Seeds study: {name}", "",
             f"Held-out split `{agg['split']}` of `{agg['task']}` {agg['task_options']} ({agg['n_examples']} "
             f"examples, the same for every seed), base policy vs the policy after {agg['trained_steps']} steps; "
             "differences in percentage points.", ""]
    for key, title in METRICS:
        m = agg["metrics"].get(key)
        if m is None:
            continue
        a = m["across_seeds"]
        lines += [f"## {title}", "", "| seed | base | trained | gain | paired bootstrap CI |",
                  "|---:|---:|---:|---:|---:|",
                  *(f"| {r['seed']} | {r['base']:.1f} | {r['trained']:.1f} | {r['delta']:+.1f} | "
                    f"{r['ci_low']:+.1f} to {r['ci_high']:+.1f} |" for r in m["per_seed"]), "",
                  f"Across {a['n_seeds']} seeds: mean gain **{a['mean']:+.1f} points** (sd {a['std']:.1f}; "
                  f"{100 * a['confidence']:.0f}% t interval {_interval(a['ci_low'], a['ci_high'])}). Goal "
                  f"+{agg['goal_points']:g} points: {m['verdict']}.", ""]
    return "\n".join(lines)


def seeds_study(config: str | Path | None, overrides: Sequence[str], seeds: Sequence[int],
                trainer: Trainer | None = None, isolate: bool = False, goal_points: float = 5.0,
                log: Callable[[str], None] = print, jobs: int = 1) -> Path:
    """Train (or skip, when finished) one run per seed, then write seeds.json and seeds.md; returns seeds.md."""
    runs = run_variants(config, overrides, seed_variants(seeds), trainer, isolate, log, jobs)
    per_seed = {s: read_json(r.run_dir / "eval" / "summary.json") for s, r in zip(seeds, runs)}
    cfg = load_grpo_config(config, overrides)
    agg = aggregate(per_seed, cfg.eval.confidence, goal_points)
    where = study_dir(cfg)
    write_study_json(where / "seeds.json", {**agg, "runs": {s: str(r.run_dir) for s, r in zip(seeds, runs)}})
    out = where / "seeds.md"
    out.write_text(render_markdown(agg, cfg.run.name))
    return out
