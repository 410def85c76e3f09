"""Time to target by the speedrun's rules, the analysis half of bench/gpu_pretrain_ttt_real.sh: the baseline's lr
grid (scalelab.pretrain.ttt_stats.grid_rule), the target from its seeds, every seed's time and tokens to it
(censored at its end when never reached) and Welch's one-sided test (ttt_stats.compare), from the run folders

    RESULTS/grid/lr-<lr>/          the baseline at each lr of the grid (seed GRID_SEED), one pass each
    RESULTS/baseline/seed-<n>/     the baseline at the tuned lr, one pass each
    RESULTS/recipe/seed-<n>/       the recipe, one pass at most, stopping at the target
    RESULTS/stats.json             written by `stats`

Each run folder holds the trainer's metrics.jsonl and train_summary.json (a finished run), the exact command (cmd)
and heldout.json (`scalelab pretrain heldout`: its WikiText-2 loss, which stats.json's "losses" puts beside its val
loss). Training seconds are bench/gpu_pretrain_ttt.py's (steady-speed compile warm-up, the clock stopped during
evaluation and checkpointing).

`steps` prints the length of one pass (scalelab.pretrain.shards.one_pass over the train shards, at the config's
micro-batch and block size): the most steps before the seeded shuffle starts its second epoch, so neither side sees
a token twice, as the speedrun's one-pass baseline needs; what it leaves out goes to stderr.

    python3 bench/gpu_pretrain_ttt_real.py grid|target|stats|finished|scored|steps --results RESULTS [--dir RUN]
        [--seeds N] [--name HELDOUT] [--config TOML --set KEY=VALUE ...]
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
from scalelab.core.provenance import git_sha  # noqa: E402
from scalelab.pretrain import ttt_stats  # noqa: E402
from scalelab.pretrain.config import load_pretrain_config  # noqa: E402
from scalelab.pretrain.heldout_record import read_records  # noqa: E402
from scalelab.pretrain.shards import PassPlan, list_shards, one_pass, shard_token_counts  # noqa: E402

LAYOUTS = ("grid", "baseline", "recipe")


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


def pass_plan(config: str | None, sets: list[str], world: int = 1) -> PassPlan:
    """One pass over the train shards of the run config (data.dir, micro-batch, block size, tokens per step)."""
    cfg = load_pretrain_config(config, sets)
    counts = shard_token_counts(list_shards(cfg.data.dir, "train"))
    return one_pass(counts, cfg.train.micro_batch_size, cfg.model.block_size, world, cfg.grad_accum(world))


def describe_pass(plan: PassPlan) -> str:
    return (f"one pass = {plan.steps} steps of {plan.windows_per_step} windows ({plan.trained_tokens:,} target "
            f"tokens); of the {plan.windows} windows of {plan.seq + 1} tokens, {plan.dropped_windows} are left out: "
            "each shard's windows past its last whole micro-batch, and the micro-batches short of a whole step")


def print_steps(plan: PassPlan) -> int:
    """The step count on stdout (the shell script reads it), what the pass leaves out on stderr."""
    if plan.steps < 1:
        raise SystemExit(f"the train shards hold {plan.windows} windows, fewer than one step's {plan.windows_per_step}")
    print(describe_pass(plan), file=sys.stderr)
    print(plan.steps)
    return 0


def losses(results: Path) -> dict[str, dict]:
    """'<layout>/<run>' -> its final val loss and each held-out set's loss and token count, for every finished run."""
    out = {}
    for layout in LAYOUTS:
        for name, curve in finished_runs(results / layout).items():
            row = {"val_loss": final_loss(curve)}
            for key, rec in read_records(results / layout / name).items():
                row |= {f"{key}_loss": rec["loss"], f"{key}_tokens": rec["tokens"]}
            out[f"{layout}/{name}"] = row
    return out


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
    doc["losses"] = losses(results)
    doc |= {"command": f"python3 bench/gpu_pretrain_ttt_real.py stats --results {results} --seeds {seeds}",
            "git_sha": git_sha()}
    (results / "stats.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("grid", "target", "stats", "finished", "scored", "steps"))
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--dir", type=Path, help="finished, scored: a run folder")
    ap.add_argument("--seeds", type=int, default=ttt_stats.MIN_SEEDS)
    ap.add_argument("--name", default="wikitext2", help="scored: the held-out set's name in heldout.json")
    ap.add_argument("--config", help="steps: the run config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="steps: a config override")
    args = ap.parse_args(argv)
    if args.verb == "finished":  # exit 0 when the run folder holds a finished run
        return 0 if (args.dir / "train_summary.json").is_file() else 1
    if args.verb == "scored":  # exit 0 when the run folder records its loss on the held-out set
        return 0 if args.name in read_records(args.dir) else 1
    if args.verb == "steps":
        return print_steps(pass_plan(args.config, args.set))
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
