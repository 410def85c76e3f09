"""Random-weight model shapes: parameter counts against the published architectures, counted by hand."""
from __future__ import annotations

import pytest
import torch

from scalelab.grpo.randmodel import random_model


@pytest.mark.parametrize("shape,vocab,expected", [
    # Qwen2.5-7B: 28 x (q 3584^2 + 3584 bias, k and v 3584 x 512 + 512 bias each, o 3584^2, MLP 3 x 3584 x 18944,
    # 2 norms of 3584) + final norm 3584 + untied embeddings and head, 2 x vocab x 3584
    ("qwen2.5-7b", 1000, 28 * (2 * 3584 ** 2 + 3584 + 2 * (3584 * 512 + 512) + 3 * 3584 * 18944 + 2 * 3584)
     + 3584 + 2 * 1000 * 3584),
    # Qwen2.5-1.5B: heads of 128, 2 KV heads (256 wide), tied embeddings
    ("qwen2.5-1.5b", 1000, 28 * (2 * 1536 ** 2 + 1536 + 2 * (1536 * 256 + 256) + 3 * 1536 * 8960 + 2 * 1536)
     + 1536 + 1000 * 1536),
])
def test_random_shapes_match_the_published_sizes(shape, vocab, expected):
    tok = type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0, "bos_token_id": 2, "__len__": lambda self: vocab})()
    model = random_model(shape, tok, torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == expected
