"""One step's rollout batch as training tensors, and the log-probabilities of its completion tokens.

Layout (N = P * G sequences, right-padded [prompt | completion | pad], length L): the loss only needs positions
that predict completion tokens, so everything per token lives in a frame of W = L - p_min positions starting at
p_min - 1 (p_min = shortest prompt of the step): frame column j holds the log-probability of token p_min + j.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from scalelab.grpo.advantages import token_entropy, token_logprobs
from scalelab.grpo.head import head_logprobs
from scalelab.grpo.precision import compute_autocast
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


@dataclass(frozen=True)
class Micro:
    """One forward/backward: some rows of the step, the input cropped to their longest sequence, and the frame
    columns that reach their last completion token."""
    rows: torch.Tensor  # (n,) row indices into the StepTensors
    length: int  # input columns kept: the longest [prompt | completion] of these rows
    width: int  # frame columns kept: length - p_min

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """The rows' slice of a frame tensor (N, W) -> (n, width)."""
        return x[self.rows, :self.width]


def micro_batches(t: StepTensors, max_rows: int, max_tokens: int = 0,
                  rows: Sequence[int] | None = None) -> list[Micro]:
    """The step's rows in forward passes of at most `max_rows` rows; with `max_tokens`, longest first and at most
    that many padded tokens each (rows x longest), so short answers share a pass instead of being padded to the
    step's longest (GSM8K answers run 20 to 512 tokens: fixed slices pad ~40% of the batch). One row longer than
    max_tokens runs alone. The loss's normalizer is the step's, so the grouping changes no gradient. `rows`: only
    these rows get a pass (loss.skip_zero_signal)."""
    lengths = t.attention_mask.sum(1).tolist()
    order = list(range(t.n)) if rows is None else list(rows)
    if max_tokens:
        order.sort(key=lambda i: -lengths[i])
    groups: list[tuple[list[int], int]] = []  # (rows, longest of them)
    cur, longest = [], 0
    for i in order:
        grown = max(longest, lengths[i])
        if cur and (len(cur) >= max_rows or (max_tokens and (len(cur) + 1) * grown > max_tokens)):
            groups.append((cur, longest))
            cur, grown = [], lengths[i]
        cur.append(i)
        longest = grown
    if cur:
        groups.append((cur, longest))
    p_min = t.input_ids.shape[1] - (t.keep - 1)
    return [Micro(torch.tensor(g, device=t.input_ids.device), int(n), max(int(n) - p_min, 1)) for g, n in groups]


def frame_logprobs(model: Any, t: StepTensors, m: Micro, temperature: float,
                   compile_head: bool = False) -> torch.Tensor:
    """(n, width) log softmax(logits / T) of each frame target under `model` (graph kept when grad is on)."""
    return frame_logprobs_entropy(model, t, m, temperature, entropy=False, compile_head=compile_head)[0]


def frame_logprobs_entropy(model: Any, t: StepTensors, m: Micro, temperature: float, entropy: bool = True,
                           head_rows: int = 2048,
                           compile_head: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """frame_logprobs and, when `entropy`, the policy's entropy at each frame position (n, width), without graph.
    Zero off the completion tokens (the loss masks them). `compile_head`: the head's elementwise passes through
    torch.compile on a GPU (grpo.head; optim.compile_head)."""
    ids, attn = t.input_ids[m.rows, :m.length], t.attention_mask[m.rows, :m.length]
    targets, mask = m.take(t.targets), m.take(t.mask).bool()
    split = body_and_head(model)
    if split is None:  # a model without a separate decoder: the whole frame's logits at once
        out = model(input_ids=ids, attention_mask=attn, logits_to_keep=m.width + 1, use_cache=False)
        logits = out.logits[:, :-1]  # (n, width, V): position p_min - 1 + j predicts token p_min + j
        ent = token_entropy(logits.detach(), temperature) if entropy else None
        return token_logprobs(logits, targets, temperature) * mask, None if ent is None else ent * mask
    body, head = split
    h = body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    h = h[:, m.length - m.width - 1:m.length - 1][mask]  # (tokens, d): completion positions only
    logp, ent = head_logprobs(head, h, targets[mask], temperature, head_rows, entropy,
                              compiled=compile_head and h.is_cuda)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return zeros.masked_scatter(mask, logp), None if ent is None else zeros.masked_scatter(mask, ent)


def body_and_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder returning the final-norm hidden states, LM head) of an HF causal LM (through a peft wrapper:
    its adapters stay in both), or None when the model does not expose them."""
    try:
        body, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if body is None or head is None or body is model or isinstance(head, torch.nn.Embedding):
        return None
    return body, head


@torch.no_grad()
def frozen_logprobs(model: Any, t: StepTensors, temperature: float, micros: list[Micro],
                    adapters_off: bool, autocast: bool = True, compile_head: bool = False) -> torch.Tensor:
    """(N, W) for the reference (LoRA: adapters disabled) or pi_old, in micro-batches, no graph; `autocast`: the
    forward in bf16 where grpo.precision says it applies (optim.bf16_autocast); `compile_head` as in
    frame_logprobs_entropy."""
    was_training = model.training
    model.eval()
    out = torch.zeros(t.mask.shape, dtype=torch.float32, device=t.mask.device)
    try:
        ctx = model.disable_adapter() if adapters_off else contextlib.nullcontext()
        with ctx, compute_autocast(model, autocast and not adapters_off):
            for m in micros:
                out[m.rows, :m.width] = frame_logprobs(model, t, m, temperature, compile_head)
        return out
    finally:
        model.train(was_training)
