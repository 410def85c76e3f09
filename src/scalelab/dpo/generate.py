"""Batched greedy generation with the chat template: the one helper every generated part of the battery uses.

Prompts are rendered with the tokenizer's chat template (generation prompt on), sorted by length so a batch
wastes little padding, left-padded (a decoder-only model continues from the last position of every row),
and decoded greedily. Each response records how many tokens it took and whether it stopped at the token
limit rather than at an end-of-turn token: the length statistics of the evidence bar are built from these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from scalelab.core.hfgen import left_pad, stop_token_ids

Conversation = list[dict]  # [{"role": ..., "content": ...}, ...]


@dataclass(frozen=True)
class Generation:
    text: str
    n_tokens: int          # generated tokens before the end-of-turn token (all of them when hit_limit)
    hit_limit: bool        # stopped by max_new_tokens, not by an end-of-turn token


def render_prompt_ids(tokenizer, conversation: Conversation) -> list[int]:
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def cut_at_stop(row: Sequence[int], stops: Sequence[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """The response tokens before the first stop id, and whether none came before the limit."""
    stop = set(stops)
    for i, t in enumerate(row):
        if t in stop:
            return list(row[:i]), False
    return list(row), len(row) >= max_new_tokens


@torch.no_grad()
def greedy_generate(model, tokenizer, conversations: Sequence[Conversation], max_new_tokens: int,
                    batch_size: int) -> list[Generation]:
    """One greedy response per conversation, in the input order."""
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"need max_new_tokens >= 1 and batch_size >= 1, got {max_new_tokens}, {batch_size}")
    device, stops = next(model.parameters()).device, stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    prompts = [render_prompt_ids(tokenizer, c) for c in conversations]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Generation | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids, mask = left_pad([prompts[i] for i in chunk], pad)
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             temperature=None, top_p=None, top_k=None, max_new_tokens=max_new_tokens,
                             eos_token_id=stops, pad_token_id=pad)
        for i, row in zip(chunk, gen[:, ids.shape[1]:].tolist()):
            tokens, hit = cut_at_stop(row, stops, max_new_tokens)
            out[i] = Generation(tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), hit)
    return [g for g in out if g is not None]
