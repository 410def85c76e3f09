"""Reward functions for GRPO (and filters for DPO pairs): `(completions, examples) -> list[float]`.

Plain functions, one float per completion, testable alone. Each example names the task that scores it, so
one batch may mix tasks. Completions may be strings or TRL's conversational form (a list of messages; the
last assistant message is scored). `for_trl` adapts any of them to TRL's calling convention.

Registry (`get_reward(name, **params)`):
  correctness   1 if the task's verifier accepts the answer, else 0
  partial       the task's partial credit (share of fields / constraints right), else correctness
  format        1 if the completion has the answer form its prompt asked for (marker, JSON, code fence)
  length_aware  correctness with a length term; `exploit` turns it into a deliberately hackable reward
                for reward-hacking studies: "length" pays for long outputs whatever their correctness,
                "format" pays for the answer marker whatever the answer; `defense="gate"` is the fix:
                the exploit term pays only on a correct answer (correctness-gated shaping)
  combined      a weighted sum of other registered rewards
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from scalelab.evals.tasks import Example, Score, default_task, score_example

RewardFn = Callable[[list, list[Example]], list[float]]
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)  # code tasks wait on sandbox processes: threads overlap them


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is; a message list -> its last assistant message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        replies = [m for m in completion if m.get("role", "assistant") == "assistant"]
        return str((replies or completion)[-1].get("content", ""))
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")


def _check_batch(completions: Sequence, examples: Sequence[Example]) -> None:
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions for {len(examples)} examples")


def score_all(completions: Sequence, examples: Sequence[Example], workers: int = DEFAULT_WORKERS) -> list[Score]:
    _check_batch(completions, examples)
    texts = [completion_text(c) for c in completions]
    if workers <= 1 or len(texts) <= 1:
        return [score_example(ex, t) for ex, t in zip(examples, texts)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(score_example, examples, texts))


def _named(fn: RewardFn, name: str) -> RewardFn:
    fn.__name__ = name  # TRL logs each reward under its function's __name__
    return fn


# ---------------------------------------------------------------------------------------------
# the rewards


def correctness_reward(completions: list, examples: list[Example]) -> list[float]:
    return [1.0 if s.correct else 0.0 for s in score_all(completions, examples)]


def partial_reward(completions: list, examples: list[Example]) -> list[float]:
    return [s.partial if s.partial is not None else float(s.correct) for s in score_all(completions, examples)]


def format_reward(completions: list, examples: list[Example]) -> list[float]:
    _check_batch(completions, examples)
    return [1.0 if default_task(ex.task).check_format(ex, completion_text(c)) else 0.0
            for c, ex in zip(completions, examples)]


def format_gated_reward(completions: list, examples: list[Example]) -> list[float]:
    """The format reward paid only with a right answer. Under GRPO's group-std scaling (Shao et al. 2024) an
    ungated format term is not a small nudge: in a group where no completion is right, the rewards differ only
    by it, and dividing by that group's std turns a 0.1 difference into advantages of +-1, as large as a right
    answer's; gating leaves such groups with no signal at all, as a verifier-only reward would."""
    fmt = format_reward(completions, examples)
    return [f * c for f, c in zip(fmt, correctness_reward(completions, examples))]


EXPLOITS = ("none", "length", "format")
DEFENSES = ("none", "gate")


def length_aware(target_chars: int = 1000, penalty: float = 0.5, exploit: str = "none",
                 exploit_weight: float = 1.0, defense: str = "none") -> RewardFn:
    """correct - penalty * overshoot, overshoot = max(0, len - target) / target capped at 1: right and
    concise beats right and rambling, and a wrong answer never gains from length.

    exploit="length": + exploit_weight * min(len / target, 2) on every completion, right or wrong.
    exploit="format": + exploit_weight * format_ok on every completion, right or wrong.
    Both are meant to be hacked (padding, or an answer marker with any number after it).

    defense="gate": the exploit term is multiplied by correctness, so only a right answer collects it. This is
    the rule of Kimi k1.5's length reward (Kimi Team 2025, sec. 2.3.3), where a wrong answer's length term is
    min(0, lambda) and can never be positive: a policy cannot raise its reward by padding or by the answer
    marker without also being right. A right answer can still be padded for pay; the gate moves the pressure
    onto correctness, it does not remove the shaping term."""
    if exploit not in EXPLOITS:
        raise ValueError(f"length_aware exploit {exploit!r}: allowed: {', '.join(EXPLOITS)}")
    if defense not in DEFENSES:
        raise ValueError(f"length_aware defense {defense!r}: allowed: {', '.join(DEFENSES)}")
    if target_chars <= 0 or penalty < 0:
        raise ValueError(f"length_aware needs target_chars > 0 and penalty >= 0, got {target_chars}, {penalty}")

    def exploit_term(completions: list, examples: list[Example], lengths: list[int]) -> list[float]:
        if exploit == "length":
            return [exploit_weight * min(n / target_chars, 2.0) for n in lengths]
        if exploit == "format":
            return [exploit_weight * f for f in format_reward(completions, examples)]
        return [0.0] * len(lengths)

    def reward(completions: list, examples: list[Example]) -> list[float]:
        lengths = [len(completion_text(c)) for c in completions]
        base = correctness_reward(completions, examples)
        extra = exploit_term(completions, examples, lengths)
        if defense == "gate":
            extra = [e * b for e, b in zip(extra, base)]
        return [b - penalty * min(1.0, max(0, n - target_chars) / target_chars) + e
                for b, n, e in zip(base, lengths, extra)]

    return _named(reward, f"length_aware_{exploit}" + ("_gated" if defense == "gate" else ""))


def combined(weights: dict[str, float]) -> RewardFn:
    """sum_k weights[k] * reward_k, each reward_k built by get_reward(k) with its defaults."""
    if not weights:
        raise ValueError("combined needs at least one reward weight")
    parts = [(get_reward(name), float(w)) for name, w in weights.items()]  # unknown names fail here, early

    def reward(completions: list, examples: list[Example]) -> list[float]:
        total = [0.0] * len(completions)
        for fn, w in parts:
            total = [t + w * r for t, r in zip(total, fn(completions, examples))]
        return total

    return _named(reward, "combined_" + "_".join(f"{k}{w:g}" for k, w in weights.items()))


REWARDS: dict[str, Callable[..., RewardFn]] = {
    "correctness": lambda: correctness_reward,
    "partial": lambda: partial_reward,
    "format": lambda: format_reward,
    "format_gated": lambda: format_gated_reward,
    "length_aware": length_aware,
    "combined": combined,
}


def get_reward(name: str, **params: Any) -> RewardFn:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; registered: {', '.join(REWARDS)}")
    return REWARDS[name](**params)


# ---------------------------------------------------------------------------------------------
# TRL


def example_row(example: Example) -> dict[str, Any]:
    """A dataset row for TRL: the prompt plus the columns `for_trl` rebuilds the example from (meta as a
    JSON string, since Arrow columns cannot hold dicts of differing shapes)."""
    return {"prompt": example.prompt, "task": example.task, "example_id": example.id,
            "answer": example.answer, "meta": json.dumps(example.meta)}


def for_trl(fn: RewardFn) -> Callable[..., list[float]]:
    """`fn` called the TRL way: reward(prompts=..., completions=..., task=[...], example_id=[...], ...)."""

    def reward(prompts: list, completions: list, task: list[str], example_id: list[str], answer: list[str],
               meta: list[str], **_ignored: Any) -> list[float]:
        examples = [Example(t, i, p if isinstance(p, list) else [{"role": "user", "content": p}], a, json.loads(m))
                    for t, i, p, a, m in zip(task, example_id, prompts, answer, meta)]
        return fn(completions, examples)

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
