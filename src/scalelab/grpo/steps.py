"""A GRPO run's steps, typed: each grpo_step line of metrics.jsonl parsed once into a StepRecord (types.py), so the
readers (report, hacking, stalestudy) use attributes and a renamed field fails where it is read, not as a silent
default. metrics.jsonl is append-only, so a step re-run after a crash appears twice; the later record wins, as in
train.summarize."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from scalelab.core.rundir import RunDir
from scalelab.grpo.types import StepRecord


def steps_from_events(events: Iterable[Mapping], where: str = "metrics.jsonl") -> list[StepRecord]:
    """The grpo_step events among `events` as records, the last per step, in step order."""
    by_step: dict[int, StepRecord] = {}
    for i, e in enumerate(events):
        if e.get("event") == "grpo_step":
            rec = StepRecord.from_json(e, f"{where} grpo_step event {i + 1}")
            by_step[rec.step] = rec
    return [by_step[s] for s in sorted(by_step)]


def read_steps(run_dir: str | Path) -> list[StepRecord]:
    rd = RunDir(run_dir)
    return steps_from_events(rd.events("grpo_step"), str(rd.metrics_path))
