"""Time to target loss, the analysis half of bench/gpu_pretrain_ttt.sh: read the baseline's and the recipe's
metrics.jsonl, put their val-loss curves on tokens and on training seconds, and compute how long the recipe took
to reach the baseline's final val loss, as a fraction of the baseline's time for its whole token budget.

Training seconds are the trainer's own per-step times (forward + backward + optimizer step, synchronized): the
clock stops during evaluation and checkpointing, as in modded-nanogpt. Each session's first WARMUP_STEPS steps
(torch.compile, cudnn autotuning) are counted at the run's median steady step time instead, so a run split over
two 10-minute calls (two compiles) is not charged more than one that fit in one call; the raw sum is kept too.

    python3 bench/gpu_pretrain_ttt.py check|finished|target|report --root ROOT --result FILE [--name NAME] [...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalelab.core.jsonio import is_stored, read_text  # noqa: E402
from scalelab.core.provenance import collect  # noqa: E402

WARMUP_STEPS = 3
RUNS = ("baseline", "recipe")
GOAL_RATIO = 0.6  # the bar: the recipe reaches the baseline's final val loss in <= 0.6x its time


@dataclass(frozen=True)
class ValPoint:
    step: int
    tokens: int
    train_s: float   # training seconds up to and including this step (warm-up steps at steady speed)
    val_loss: float


@dataclass(frozen=True)
class RunCurve:
    steps: int
    tokens: int
    train_s: float       # warm-up steps at steady speed (the compared number)
    train_s_raw: float   # every step as measured, compiles included
    median_step_ms: float
    tokens_per_s: float
    sessions: int
    finished: bool       # the trainer exited normally: budget spent or target reached (train_summary.json)
    val: tuple[ValPoint, ...]

    @property
    def final_val_loss(self) -> float | None:
        return self.val[-1].val_loss if self.val else None


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl rows (or a committed metrics.jsonl.xz's); a torn last line (a kill mid-write) is skipped."""
    rows = []
    for line in read_text(path).splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def curve_from_rows(rows: list[dict], finished: bool) -> RunCurve:
    """The surviving record of every step (a resumed session repeats the steps after its checkpoint: the
    later record is the one the final weights descend from), each tagged with its place in its session."""
    train, val, session, place = {}, {}, 0, 0
    for r in rows:
        if r["event"] == "run_start":
            session, place = session + 1, 0
        elif r["event"] == "train":
            train[r["step"]] = (r["step_ms"], place < WARMUP_STEPS, r["tokens"])
            place += 1
        elif r["event"] == "val":
            val[r["step"]] = (r["tokens"], r["val_loss"])
    if not train:
        return RunCurve(0, 0, 0.0, 0.0, float("nan"), float("nan"), session, finished, ())
    steady = [ms for ms, warm, _ in train.values() if not warm] or [ms for ms, _, _ in train.values()]
    median_ms = statistics.median(steady)
    elapsed, raw, at_step = 0.0, 0.0, {}
    for step in sorted(train):
        ms, warm, _ = train[step]
        elapsed, raw = elapsed + (median_ms if warm else ms) / 1000, raw + ms / 1000
        at_step[step] = elapsed
    last = max(train)
    points = tuple(ValPoint(s, val[s][0], at_step[s], val[s][1]) for s in sorted(val) if s in at_step)
    return RunCurve(last, train[last][2], elapsed, raw, median_ms, train[last][2] / last / (median_ms / 1000),
                    session, finished, points)


def read_run(run_dir: Path) -> RunCurve | None:
    path = run_dir / "metrics.jsonl"
    if not is_stored(path):
        return None
    return curve_from_rows(read_metrics(path), (run_dir / "train_summary.json").is_file())


def time_to_target(val: tuple[ValPoint, ...], target: float) -> dict | None:
    """The first evaluation at or below target (what the trainer's stop sees: an upper bound, since the target
    was crossed somewhere in the last interval) and the linear interpolation inside that interval."""
    for i, p in enumerate(val):
        if p.val_loss <= target:
            if i == 0:
                return {"step": p.step, "tokens": p.tokens, "train_s": p.train_s, "train_s_interpolated": p.train_s}
            q = val[i - 1]
            frac = (q.val_loss - target) / (q.val_loss - p.val_loss)
            return {"step": p.step, "tokens": p.tokens, "train_s": p.train_s,
                    "train_s_interpolated": q.train_s + frac * (p.train_s - q.train_s)}
    return None


def compare(baseline: RunCurve, recipe: RunCurve | None) -> dict:
    """The verdict: target = the baseline's final val loss at its full budget; ratio = the recipe's training
    seconds to reach it / the baseline's training seconds for the whole budget."""
    if not baseline.finished or baseline.final_val_loss is None:
        return {"status": "baseline not finished"}
    target = baseline.final_val_loss
    out = {"target_val_loss": target, "baseline_train_s": baseline.train_s, "goal_ratio": GOAL_RATIO}
    hit = time_to_target(recipe.val, target) if recipe else None
    if hit is None:
        status = "recipe did not reach the target" if recipe and recipe.finished else "recipe not finished"
        return {**out, "status": status}
    ratio = hit["train_s"] / baseline.train_s
    return {**out, "status": "done", "recipe_to_target": hit, "ratio": ratio,
            "ratio_interpolated": hit["train_s_interpolated"] / baseline.train_s,
            "token_ratio": hit["tokens"] / baseline.tokens, "goal_met": ratio <= GOAL_RATIO}


def curve_dict(c: RunCurve) -> dict:
    return {**{k: v for k, v in asdict(c).items() if k != "val"}, "final_val_loss": c.final_val_loss,
            "val_loss_by_tokens": {str(p.tokens): p.val_loss for p in c.val},
            "val_loss_by_train_s": [[round(p.train_s, 3), p.val_loss] for p in c.val],
            "val": [asdict(p) for p in c.val]}


def curve_from_dict(d: dict) -> RunCurve:
    fields = {k: d[k] for k in RunCurve.__dataclass_fields__ if k != "val"}
    return RunCurve(**fields, val=tuple(ValPoint(**p) for p in d["val"]))


# ------------------------------------------------------------------------------------------------
# state across calls: the run folders while the machine is warm, the results file (committed, carried) after


def load_result(path: Path, key: dict) -> dict:
    """The results file of an earlier call with the same settings, else a fresh one; refuses to mix settings."""
    if not path.is_file():
        return {"settings": key, "runs": {}}
    doc = json.loads(path.read_text())
    if doc.get("settings") != key:
        print(f"{path} holds a time-to-target measurement with other settings {doc.get('settings')}; now {key}. "
              "Move it aside or set RESULT= to another file.", file=sys.stderr)
        raise SystemExit(2)
    return doc


def current_runs(root: Path, doc: dict) -> dict[str, RunCurve]:
    """Each run from its folder when this machine has it (newer), else as an earlier call recorded it."""
    runs = {}
    for name in RUNS:
        fresh = read_run(root / name)
        stored = curve_from_dict(doc["runs"][name]) if name in doc["runs"] else None
        if fresh is None or (stored is not None and stored.finished and not fresh.finished):
            fresh = stored
        if fresh is not None:
            runs[name] = fresh
    return runs


def provenance(commands: dict) -> dict:
    info = collect({"commands": commands, "bench": "bench/gpu_pretrain_ttt.sh",
                    "env": {k: os.environ[k] for k in ("TOKENS", "RECIPE_TOKENS", "VAL_EVERY", "BASE_SETS",
                                                       "RECIPE_SETS", "EXTRA_SETS", "DATA", "BUDGET_S")
                            if k in os.environ}})
    try:
        import torch
        info["torch_cuda_triton"] = f"{torch.__version__} {torch.version.cuda} " + __import__("triton").__version__
    except ImportError:
        pass
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def report(root: Path, result: Path, out: Path | None, key: dict, commands: dict) -> dict:
    doc = load_result(result, key)
    runs = current_runs(root, doc)
    doc["runs"] = {name: curve_dict(c) for name, c in runs.items()}
    doc["verdict"] = compare(runs["baseline"], runs.get("recipe")) if "baseline" in runs else {"status": "no runs"}
    doc["commands"] = {**doc.get("commands", {}), **commands}
    doc["provenance"] = provenance(doc["commands"])
    text = json.dumps(doc, indent=2) + "\n"
    for path in filter(None, (result, out)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return doc


def format_report(doc: dict) -> str:
    lines = []
    for name, c in doc["runs"].items():
        lines.append(f"{name:9s} steps {c['steps']:4d}  tokens {c['tokens']:>12,d}  train {c['train_s']:7.1f} s "
                     f"(raw {c['train_s_raw']:.1f})  {c['tokens_per_s']:>9,.0f} tok/s  final val "
                     f"{c['final_val_loss'] if c['final_val_loss'] is not None else float('nan'):.4f}"
                     f"  {'finished' if c['finished'] else 'running'}")
    v = doc["verdict"]
    lines.append(f"verdict: {v['status']}")
    if v["status"] == "done":
        lines.append(f"target {v['target_val_loss']:.4f}: recipe {v['recipe_to_target']['train_s']:.1f} s vs "
                     f"baseline {v['baseline_train_s']:.1f} s -> ratio {v['ratio']:.3f} (interpolated "
                     f"{v['ratio_interpolated']:.3f}; tokens {v['token_ratio']:.3f}); goal <= {GOAL_RATIO}: "
                     f"{'met' if v['goal_met'] else 'not met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("check", "finished", "target", "report"))
    ap.add_argument("--root", type=Path, required=True, help="folder holding the baseline/ and recipe/ run folders")
    ap.add_argument("--result", type=Path, required=True, help="results file kept across calls (committed)")
    ap.add_argument("--out", type=Path, help="a copy of the results file ($OUT)")
    ap.add_argument("--name", choices=RUNS, help="finished: which run")
    ap.add_argument("--key", default="{}", help="JSON of the settings that must match across calls")
    ap.add_argument("--command", action="append", default=[], metavar="NAME=CMD", help="a run's trainer command")
    args = ap.parse_args(argv)
    key = json.loads(args.key)
    doc = load_result(args.result, key)
    runs = current_runs(args.root, doc)
    if args.verb == "check":  # load_result has refused a results file of other settings by now
        return 0
    if args.verb == "finished":  # exit 0 when the run needs no more training
        return 0 if args.name in runs and runs[args.name].finished else 1
    if args.verb == "target":
        base = runs.get("baseline")
        if base is None or not base.finished:
            print("baseline not finished", file=sys.stderr)
            return 1
        print(repr(base.final_val_loss))
        return 0
    commands = dict(c.split("=", 1) for c in args.command)
    print(format_report(report(args.root, args.result, args.out, key, commands)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
