"""Time to target by the speedrun's rules, the analysis half of bench/gpu_pretrain_ttt_real.sh: the baseline's lr
grid (scalelab.pretrain.ttt_stats.grid_rule), the target from its seeds, every seed's time and tokens to it
(censored at its end when never reached) and Welch's one-sided test (ttt_stats.compare), from the run folders

    RESULTS/grid/lr-<lr>/          the baseline at each lr of the grid (seed GRID_SEED), one pass each
    RESULTS/baseline/seed-<n>/     the baseline at the tuned lr, one pass each
    RESULTS/recipe/seed-<n>/       the recipe, one pass at most, stopping at the target
    RESULTS/stats.json             written by `stats`

Each run folder holds the trainer's metrics.jsonl and train_summary.json (a finished run) and the exact command
(cmd). Training seconds are bench/gpu_pretrain_ttt.py's (steady-speed compile warm-up, the clock stopped during
evaluation and checkpointing).

    python3 bench/gpu_pretrain_ttt_real.py grid|target|stats|finished --results RESULTS [--dir RUN] [--seeds N]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import gpu_pretrain_ttt as ttt  # noqa: E402
from scalelab.pretrain import ttt_stats  # noqa: E402


def finished_runs(folder: Path) -> dict[str, ttt.RunCurve]:
    """name -> curve, for every run folder under `folder` whose trainer exited normally."""
    out = {}
    for d in sorted(p for p in folder.glob("*") if p.is_dir()):
        curve = ttt.read_run(d)
        if curve is not None and curve.finished:
            out[d.name] = curve
    return out


def final_loss(c: ttt.RunCurve) -> float:
    return c.final_val_loss if c.final_val_loss is not None else math.nan


def grid(results: Path) -> ttt_stats.GridRule:
    runs = finished_runs(results / "grid")
    lrs = [float(name.removeprefix("lr-")) for name in runs]
    return ttt_stats.grid_rule(lrs, [final_loss(c) for c in runs.values()])


def seed_of(name: str) -> int:
    return int(name.removeprefix("seed-"))


def target(results: Path, seeds: int) -> float:
    runs = finished_runs(results / "baseline")
    if len(runs) < seeds:
        raise SystemExit(f"{len(runs)} of {seeds} baseline seeds finished")
    return ttt_stats.target_loss([final_loss(c) for c in runs.values()])


def seed_times(runs: dict[str, ttt.RunCurve], goal: float) -> list[ttt_stats.SeedTime]:
    return [ttt_stats.seed_time(seed_of(name), [(p.tokens, p.train_s, p.val_loss) for p in c.val], goal,
                                c.train_s, c.tokens) for name, c in runs.items()]


def stats(results: Path, seeds: int) -> dict:
    rule = grid(results)
    doc = {"grid": asdict(rule), "rules": {"target": "mean over the baseline's seeds of its val loss after one "
                                                     "pass", "censoring": "a run that never reaches the target "
                                                     "counts at its end; 'faster' needs every recipe run to reach it",
                                           "test": "Welch's one-sided t-test on training seconds, p < 0.01"}}
    base, recipe = finished_runs(results / "baseline"), finished_runs(results / "recipe")
    if rule.status != "tuned" or len(base) < seeds or len(recipe) < seeds:
        doc["status"] = f"incomplete: grid {rule.status}, {len(base)} baseline and {len(recipe)} recipe seeds"
    else:
        goal = target(results, seeds)
        doc.update(status="done", **ttt_stats.compare(seed_times(base, goal), seed_times(recipe, goal), goal))
    (results / "stats.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("grid", "target", "stats", "finished"))
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--dir", type=Path, help="finished: a run folder")
    ap.add_argument("--seeds", type=int, default=ttt_stats.MIN_SEEDS)
    args = ap.parse_args(argv)
    if args.verb == "finished":  # exit 0 when the run folder holds a finished run
        return 0 if (args.dir / "train_summary.json").is_file() else 1
    if args.verb == "grid":  # "tuned LR" | "extend low LR" | "extend high LR" | "too few"
        rule = grid(args.results)
        lr = rule.best_lr if rule.status == "tuned" else rule.next_lr
        print(rule.status + ("" if lr is None else f" {lr:.4g}"))
        return 0
    if args.verb == "target":
        print(repr(target(args.results, args.seeds)))
        return 0
    doc = stats(args.results, args.seeds)
    print(json.dumps({k: doc.get(k) for k in ("status", "target_val_loss", "ratio_train_s", "faster", "goal_met")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
