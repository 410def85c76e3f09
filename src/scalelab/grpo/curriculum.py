"""An easy-first curriculum: train on stage 0 until the rolling train accuracy reaches a threshold, then move on.

Why: GRPO learns only from groups whose rewards differ (advantages.zero_signal_fraction). A weak model on a task
it almost never solves (SmolLM2-135M: 14% greedy on 2-digit sums) makes mostly all-wrong groups, so most of a
step teaches nothing; on 1-digit sums it is right often enough for groups to disagree. Promotion by measured
accuracy rather than a fixed schedule follows the competence-based curriculum of Platanios et al. (2019).

The state is a few numbers and lives in the checkpoint, so a resumed run promotes exactly as an uninterrupted one.
Stages are task-option tables merged over the target's (the last stage is the target itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def stage_options(target: dict, levels: list[dict]) -> list[dict]:
    """Task options of every stage, easiest first: each level merged over the target, then the target."""
    return [{**target, **level} for level in levels] + [dict(target)]


@dataclass
class Curriculum:
    n_stages: int
    promote_at: float
    window: int
    stage: int = 0
    recent: list[float] = field(default_factory=list)  # the metric at the current stage, newest last
    promotions: list[int] = field(default_factory=list)  # steps after which a promotion happened

    @property
    def final(self) -> bool:
        return self.stage == self.n_stages - 1

    @property
    def rolling(self) -> float | None:
        tail = self.recent[-self.window:]
        return sum(tail) / len(tail) if tail else None

    def observe(self, step: int, value: float) -> tuple[bool, float]:
        """Record one step's metric at the current stage: (whether this promotes to the next stage, the rolling
        accuracy it was judged on)."""
        self.recent.append(float(value))
        rolling = self.rolling
        if self.final or len(self.recent) < self.window or rolling < self.promote_at:
            return False, rolling
        self.stage += 1
        self.recent = []
        self.promotions.append(step)
        return True, rolling

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "recent": list(self.recent), "promotions": list(self.promotions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage, self.recent = int(state["stage"]), [float(x) for x in state["recent"]]
        self.promotions = [int(x) for x in state["promotions"]]
