"""The held-out learning curve: greedy pass@1 on the first eval.curve_limit held-out examples every eval.every
steps, logged as 'heldout_curve' events in metrics.jsonl. The end-of-run comparison (eval.at_end) says where a run
ended; the curve says whether it passed through a better point on the way (a sharpening run can score its best
held-out number early and then lose it while its training reward still rises).

Each point keeps every example's verdict as a 0/1 string, so two points (or two runs on the same subset) can be
compared problem by problem with a paired interval.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from scalelab.grpo import heldout
from scalelab.grpo.config import GrpoConfig


def due(cfg: GrpoConfig, steps_done: int) -> bool:
    """Whether the policy after `steps_done` optimizer steps gets a curve point (step 0: the base policy)."""
    return cfg.eval.every > 0 and steps_done % cfg.eval.every == 0


def subset(cfg: GrpoConfig, examples: Sequence[Any]) -> list[Any]:
    return list(examples[:cfg.eval.curve_limit])


def point(ev: heldout.PolicyEval, cfg: GrpoConfig, steps_done: int, source: str) -> dict:
    """One curve point from an evaluation of (at least) the subset: its first curve_limit examples are scored."""
    rows = ev.examples[:cfg.eval.curve_limit]
    correct = [bool(r.greedy_correct) for r in rows]
    strict = heldout.strict_scores(replace(ev, examples=rows), cfg)
    return {"step": steps_done, "weights_version": ev.weights_version, "n": len(rows),
            "greedy_pass1": float(np.mean(correct)) if rows else 0.0,
            "strict_pass1": None if strict is None else float(np.mean(strict)),
            "greedy_tokens_mean": float(np.mean([r.greedy_tokens or 0 for r in rows])) if rows else 0.0,
            "correct": "".join("1" if c else "0" for c in correct), "wall_s": ev.wall_s, "source": source}


def measure(engine: Any, tokenizer: Any, examples: Sequence[Any], cfg: GrpoConfig, steps_done: int) -> dict:
    """Greedy pass@1 of the engine's current weights on the subset (no sampled pass: a curve needs one number)."""
    s = replace(heldout.EvalSettings.from_config(cfg), greedy=True, samples=0)
    ev = heldout.evaluate_policy(engine, tokenizer, subset(cfg, examples), s, f"curve-{steps_done}",
                                 heldout.base_key(cfg), cfg.eval.split)
    return point(ev, cfg, steps_done, "measured")


def read_curve(events: Sequence[dict]) -> list[dict]:
    """The run's curve points by step, the last record of a step winning (a resumed step is measured again)."""
    by_step = {e["step"]: e for e in events if e.get("event") == "heldout_curve"}
    return [by_step[s] for s in sorted(by_step)]
