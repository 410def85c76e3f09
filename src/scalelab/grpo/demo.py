"""The GRPO part of `scalelab demo`: configs/grpo/tiny-cpu.toml, shortened to fit the portfolio demo's budget,
with the held-out evaluation on, then its REPORT.md.

Shortened how (measured on 2 shared CPU cores, 1 thread): tiny-cpu.toml's 30 steps of 4 x 8 completions take
~40-60 s each; 2 x 8 completions of at most 8 tokens ("14<|im_end|>" is 3) take about half that, so 6 steps,
the model load and the greedy pass@1 of base and trained policy on 32 held-out sums fit in ~4 minutes.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.heldout import headline
from scalelab.grpo.report import build_report
from scalelab.grpo.train import train

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "grpo" / "tiny-cpu.toml"
DEMO_OVERRIDES = ("run.name=demo-cpu", "train.max_steps=6", "train.checkpoint_every=0", "data.prompts_per_step=2",
                  "rollout.max_new_tokens=8", "eval.at_end=true", "eval.limit=32", "eval.greedy=true",
                  "eval.samples=0", "eval.bootstrap_resamples=2000")


def grpo_demo(args: argparse.Namespace) -> str:
    """Train the shortened tiny-cpu run from scratch, write its report; one line for the demo's summary.
    `args.grpo_set` (optional) adds --set overrides after the demo's own."""
    if not CONFIG.is_file():
        raise FileNotFoundError(f"{CONFIG} not found: run the demo from a checkout of scalelab")
    cfg = load_grpo_config(CONFIG, [*DEMO_OVERRIDES, *getattr(args, "grpo_set", ())])
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # the demo's own folder: a fresh run every time
    print(f"[demo] grpo: LoRA GRPO of {cfg.model.name} on {cfg.data.task} {cfg.data.task_options}, "
          f"{cfg.train.max_steps} steps of {cfg.data.prompts_per_step} x {cfg.rollout.group_size} completions")
    results = train(cfg)
    report = build_report(cfg.run_dir)
    held = headline(results["heldout"]) if "heldout" in results else "held-out: not measured"
    return (f"grpo: reward {results['reward_first_quarter']:.3f} -> {results['reward_last_quarter']:.3f} (first -> "
            f"last quarter of {results['steps']} steps); {held}; report: {report}")
