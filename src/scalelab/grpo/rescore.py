"""A run's held-out result recomputed on the CPU from the generations it kept: `scalelab grpo eval RUN --rescore`.

A committed run folder has no checkpoint and no model, but eval/base.json and trained.json keep every problem's
greedy completion. Each is scored again by the task's own scorer (the lenient reading; the strict one is re-read
from the texts by `heldout.compare`), the paired comparison is recomputed with the run's own bootstrap settings,
and the result is set beside the recorded eval/summary.json: a reader can check the reported gain without a GPU.

    rescore_run(run_dir) -> Rescored      summary recomputed, the recorded one, and every difference between them

Sampled pass@k cannot be re-scored (the samples' texts are not kept); their recorded counts are carried over, as
are the verdicts of a run whose greedy texts were dropped (textdrop.py): its summary is then recomputed from
verdicts only, and `from_texts` says how many problems were graded again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.core.jsonio import is_stored, read_json
from scalelab.evals.tasks import Example
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.heldout import PolicyEval, Scorer, compare, default_scorer, eval_dir, load_eval

TOLERANCE = 1e-9  # the same arithmetic on the same inputs: anything beyond float noise is a real difference


@dataclass(frozen=True)
class Rescored:
    summary: dict            # compare() of the re-scored base and trained evaluations
    recorded: dict | None    # eval/summary.json as committed, None when there is none
    changed: dict[str, int]  # policy -> problems whose recorded greedy verdict the re-scoring does not confirm
    from_texts: dict[str, int]  # policy -> problems graded again from a kept text (the rest keep their verdicts)
    differences: list[str]   # "greedy_pass1.trained: recorded 0.366, re-scored 0.365", one per differing value

    @property
    def reproduces(self) -> bool:
        return self.recorded is not None and not self.differences and not any(self.changed.values())


def rescore_policy(ev: PolicyEval, task: str, options: dict, scorer: Scorer = default_scorer) -> PolicyEval:
    """`ev` with each kept greedy text scored again; rows without a text keep their recorded verdict."""
    rows = tuple(r if r.greedy_text is None else
                 replace(r, greedy_correct=bool(scorer(Example(task, r.id, [], r.answer, dict(options)),
                                                       r.greedy_text)))
                 for r in ev.examples)
    greedy = [float(r.greedy_correct) for r in rows if r.greedy_correct is not None]
    return replace(ev, examples=rows, greedy_pass1=float(np.mean(greedy)) if ev.greedy_pass1 is not None else None)


def differences(recorded: Any, rescored: Any, where: str = "") -> list[str]:
    """Every leaf where the two summaries differ (numbers beyond TOLERANCE), named by its dotted path."""
    if isinstance(recorded, dict) and isinstance(rescored, dict):
        return [d for k in sorted(set(recorded) | set(rescored), key=str)
                for d in differences(recorded.get(k), rescored.get(k), f"{where}.{k}" if where else str(k))]
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (recorded, rescored))
    if numbers and abs(recorded - rescored) <= TOLERANCE or not numbers and recorded == rescored:
        return []
    return [f"{where}: recorded {recorded!r}, re-scored {rescored!r}"]


def rescore_run(run_dir: str | Path, scorer: Scorer = default_scorer) -> Rescored:
    run_dir = Path(run_dir)
    cfg = load_grpo_config(run_dir / "config.toml")
    evals = {p: load_eval(run_dir, p) for p in ("base", "trained")}
    missing = [p for p, ev in evals.items() if ev is None]
    if missing:
        raise FileNotFoundError(f"{eval_dir(run_dir)}: no kept {' or '.join(missing)} evaluation "
                                f"({', '.join(p + '.json' for p in missing)}); `grpo eval` writes them")
    task, options = cfg.data.task, cfg.data.task_options
    again = {p: rescore_policy(ev, task, options, scorer) for p, ev in evals.items()}
    changed = {p: sum(a.greedy_correct != b.greedy_correct for a, b in zip(evals[p].examples, again[p].examples))
               for p in evals}
    texts = {p: sum(r.greedy_text is not None for r in ev.examples) for p, ev in evals.items()}
    summary = compare(again["base"], again["trained"], cfg)
    path = eval_dir(run_dir) / "summary.json"
    recorded = read_json(path) if is_stored(path) else None
    return Rescored(summary, recorded, changed, texts, [] if recorded is None else differences(recorded, summary))
