"""Helpers for batched generation with HF decoder-only models, shared by the dpo battery and grpo rollouts."""
from __future__ import annotations

from typing import Any, Sequence

import torch


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the tokenizer's eos and the generation config's (an int or a list; ChatML models end on
    <|im_end|>), read through a peft wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gen_eos = getattr(getattr(base, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])}
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer and the model's generation config name no end-of-sequence token")
    return sorted(ids)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T_max), padded on the left: decoder-only generation continues from
    the right edge."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return (ids, mask) if device is None else (ids.to(device), mask.to(device))
