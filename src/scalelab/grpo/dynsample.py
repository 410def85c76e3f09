"""DAPO's dynamic sampling in one pass: roll out more prompts' groups than a step trains on and keep the groups
whose rewards differ.

A group whose G answers are all right or all wrong has advantage 0 everywhere, so it adds nothing to the gradient
but still fills the batch and the token normalizer (groupsignal.py measures the share). DAPO (Yu et al. 2025,
"dynamic sampling") samples again until the batch holds only such groups with a signal; here a step rolls out
ceil(P x data.oversample) prompts' groups once and trains on P of them: the groups with a signal first, in the
batch's order, then groups without one to fill the P when too few differ. The rollout costs about `oversample`
times more; the update is the same size.

    GrpoConfig.rollout_prompts_per_step -> int     ceil(P x oversample) (config.generated_prompts)
    choose_groups(rewards, G, P) -> list[int]      the kept groups' indices, ascending
    take_groups(batch, groups, G) -> RolloutBatch  those groups' sequences, in order
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from scalelab.grpo.advantages import signal_groups, zero_signal_fraction
from scalelab.grpo.types import RolloutBatch


@dataclass(frozen=True)
class Selection:
    generated_groups: int
    generated_zero_signal_frac: float  # over every group rolled out, before the choice
    kept: tuple[int, ...]


def choose_groups(rewards: torch.Tensor, group_size: int, keep: int) -> list[int]:
    signal = signal_groups(rewards, group_size).tolist()
    order = [g for g, s in enumerate(signal) if s] + [g for g, s in enumerate(signal) if not s]
    return sorted(order[:keep])


def take_groups(batch: RolloutBatch, groups: Sequence[int], group_size: int) -> RolloutBatch:
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    pick = lambda xs: tuple(xs[i] for i in rows)  # noqa: E731
    return replace(batch, prompt_ids=pick(batch.prompt_ids), completion_ids=pick(batch.completion_ids),
                   texts=pick(batch.texts), logprobs=pick(batch.logprobs), finished=pick(batch.finished))


def selection(rewards: torch.Tensor, group_size: int, keep: int) -> Selection:
    return Selection(rewards.numel() // group_size, zero_signal_fraction(rewards, group_size),
                     tuple(choose_groups(rewards, group_size, keep)))
