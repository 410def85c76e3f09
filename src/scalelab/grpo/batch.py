"""One step's rollout batch as training tensors, and the log-probabilities of its completion tokens.

Layout (N = P * G sequences, right-padded [prompt | completion | pad], length L): the loss only needs positions
that predict completion tokens, so everything per token lives in a frame of W = L - p_min positions starting at
p_min - 1 (p_min = shortest prompt of the step): frame column j holds the log-probability of token p_min + j.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from scalelab.grpo.advantages import token_entropy, token_logprobs
from scalelab.grpo.types import RolloutBatch


@dataclass(frozen=True)
class StepTensors:
    input_ids: torch.Tensor  # (N, L) right-padded
    attention_mask: torch.Tensor  # (N, L)
    targets: torch.Tensor  # (N, W) token predicted at each frame column
    mask: torch.Tensor  # (N, W) 1 on completion tokens
    behavior_logp: torch.Tensor  # (N, W) from the rollout engine
    advantages: torch.Tensor  # (N,)
    keep: int  # logits_to_keep = W + 1

    @property
    def n(self) -> int:
        return self.input_ids.shape[0]


def collate(batch: RolloutBatch, advantages: torch.Tensor, pad_id: int, device: torch.device) -> StepTensors:
    rows = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    L, p_min = max(len(r) for r in rows), min(len(p) for p in batch.prompt_ids)
    W = L - p_min
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    mask, behav = torch.zeros((len(rows), W)), torch.zeros((len(rows), W))
    for i, (p, c, lp) in enumerate(zip(batch.prompt_ids, batch.completion_ids, batch.logprobs)):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        attn[i, :len(p) + len(c)] = 1
        start = len(p) - p_min  # frame column of the first completion token
        mask[i, start:start + len(c)] = 1
        behav[i, start:start + len(c)] = torch.tensor(lp, dtype=torch.float32)
    targets = ids[:, p_min:]
    return StepTensors(ids.to(device), attn.to(device), targets.to(device), mask.to(device), behav.to(device),
                       advantages.to(device), W + 1)


def frame_logprobs(model: Any, t: StepTensors, rows: slice, temperature: float) -> torch.Tensor:
    """(n, W) log softmax(logits / T) of each frame target under `model` (graph kept when grad is on)."""
    return frame_logprobs_entropy(model, t, rows, temperature, entropy=False)[0]


def frame_logprobs_entropy(model: Any, t: StepTensors, rows: slice, temperature: float,
                           entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """frame_logprobs and, when `entropy`, the policy's entropy at each frame position (n, W), without graph."""
    out = model(input_ids=t.input_ids[rows], attention_mask=t.attention_mask[rows], logits_to_keep=t.keep,
                use_cache=False)
    logits = out.logits[:, :-1]  # (n, W, V): position p_min - 1 + j predicts token p_min + j
    ent = token_entropy(logits.detach(), temperature) if entropy else None
    return token_logprobs(logits, t.targets[rows], temperature), ent


def micro_slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def frozen_logprobs(model: Any, t: StepTensors, temperature: float, micro: int, adapters_off: bool) -> torch.Tensor:
    """(N, W) for the reference (LoRA: adapters disabled) or pi_old, in micro-batches, no graph."""
    was_training = model.training
    model.eval()
    try:
        ctx = model.disable_adapter() if adapters_off else contextlib.nullcontext()
        with ctx:
            return torch.cat([frame_logprobs(model, t, s, temperature) for s in micro_slices(t.n, micro)])
    finally:
        model.train(was_training)
