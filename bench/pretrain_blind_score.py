#!/usr/bin/env python
"""Score the committed blind predictions (bench/pretrain_blind_predictions.py) against the runs that tested them.

    python bench/pretrain_blind_score.py results/h100/pretrain/blind-sizes            # reads predictions.json
                                                                                       # and trained/<L..-d..-s..>/

For each size: tokens/s, peak memory and final val loss, each as predicted (point and the interval fixed before the
run), measured, the point error (measured / predicted - 1) and whether the interval holds the measurement. A run
that finished is read from its results.json. A run cut off before its last step (a lease that ended) is read from
its metrics.jsonl the way the trainer summarizes a finished one (pretrain.train_gpt._finish: the upper median of
the step times after the first three, the running peak of allocated memory); its val loss, measured only at the
last step, is then "not measured", never extrapolated. Writes scored.json beside predictions.json and prints the
table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from scalelab.core.jsonio import is_stored, iter_jsonl, read_json, write_json
from scalelab.core.provenance import git_sha
from scalelab.pretrain.docs_blind import scored_table

GIB = 2 ** 30
WARMUP_STEPS = 3   # the trainer's own skip (warm-up and compile steps)


def run_name(size: dict) -> str:
    s = size["shape"]
    steps = next(int(x.split("=")[1]) for x in size["sets"] if x.startswith("train.max_steps="))
    return f"L{s['n_layer']}-d{s['n_embd']}-s{steps}"


def read_partial(run: Path) -> dict:
    """A cut-off run's figures from its train events, summarized as the trainer summarizes a finished run."""
    train = [e for e in iter_jsonl(run / "metrics.jsonl") if e.get("event") == "train"]
    if len(train) <= WARMUP_STEPS:
        raise ValueError(f"{run}: {len(train)} train steps logged, too few to time past the warm-up")
    by_step = {e["step"]: e for e in train}   # a resumed step's later record wins
    steps = [by_step[k] for k in sorted(by_step)]
    steady = sorted(e["step_ms"] for e in steps[WARMUP_STEPS:])
    median_ms = steady[len(steady) // 2]
    tokens_per_step = steps[0]["tokens"] // steps[0]["step"]
    return {"complete": False, "steps": steps[-1]["step"], "tokens_per_s": tokens_per_step / (median_ms / 1000),
            "peak_memory_gib": max(e["memory_gib"] for e in steps), "final_val_loss": None}


def read_measured(run: Path) -> dict:
    if is_stored(run / "results.json"):
        r = read_json(run / "results.json")
        return {"complete": True, "steps": r["steps"], "tokens_per_s": r["tokens_per_s"],
                "peak_memory_gib": r["peak_memory_gib"], "final_val_loss": r["final_val_loss"]}
    if is_stored(run / "metrics.jsonl"):
        return read_partial(run)
    raise FileNotFoundError(f"{run}: neither results.json nor metrics.jsonl; was this size run?")


def score(name: str, point: float, low: float, high: float, measured: float | None) -> dict:
    row = {"quantity": name, "predicted": point, "low": low, "high": high, "measured": measured}
    if measured is None:
        return {**row, "error": None, "inside": None}
    return {**row, "error": measured / point - 1, "inside": low <= measured <= high}


def score_size(size: dict, measured: dict) -> dict:
    p = size["prediction"]
    t, m = p["throughput"], p["memory"]
    lo_loss, hi_loss = size["loss_held_out_interval"]
    rows = [score("tokens/s", t["tokens_per_s"], t["tokens_per_s_low"], t["tokens_per_s_high"],
                  measured["tokens_per_s"]),
            score("peak memory GiB", m["total_bytes"] / GIB, m["total_bytes_low"] / GIB, m["total_bytes_high"] / GIB,
                  measured["peak_memory_gib"]),
            score("final val loss", p["loss"]["final_loss"], lo_loss, hi_loss, measured["final_val_loss"])]
    return {"size": size["size"], "run": run_name(size), "measured": measured, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a blind-sizes folder: predictions.json and trained/")
    ap.add_argument("--runs", type=Path, help="where the run folders are (default FOLDER/trained)")
    args = ap.parse_args(argv)
    pred = read_json(args.folder / "predictions.json")
    runs = args.runs or args.folder / "trained"
    scored = [score_size(s, read_measured(runs / run_name(s))) for s in pred["sizes"]]
    out = {"schema": "scalelab.blind_scores/1", "predictions_written_unix": pred["written_unix"],
           "predictions_git_sha": pred["git_sha"], "sizes": scored, "git_sha": git_sha(),
           "command": f"python bench/pretrain_blind_score.py {args.folder}"}
    write_json(args.folder / "scored.json", out)
    print("\n".join(scored_table(scored, gib_digits=2, miss="no")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
