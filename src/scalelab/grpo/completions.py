"""Rows of sampled tokens, as every engine shapes them: prompts repeated group-major, completions cut at the
first stop token, token ids decoded to the texts the rewards read."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def cut_at_stop(row: Sequence[int], stop_ids: Sequence[int]) -> tuple[int, bool]:
    """(length up to and including the first stop token, whether one was found)."""
    for i, tok in enumerate(row):
        if tok in stop_ids:
            return i + 1, True
    return len(row), False


def repeat_prompts(prompts: Sequence[Sequence[int]], n: int) -> list[tuple[int, ...]]:
    return [tuple(p) for p in prompts for _ in range(n)]


def text_decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


def batch_decoder(tokenizer: Any) -> Callable[[list[list[int]]], list[str]]:
    # one call for the whole batch: a fast tokenizer decodes it in Rust rather than one Python call per row
    return lambda rows: tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []
