"""Parameter counts of train_gpt.GPT from its config alone: what the throughput model (6N FLOPs per token)
and the loss laws (N without the position table) are fed."""
from __future__ import annotations

from scalelab.pretrain.config import ModelConfig


def count_params(m: ModelConfig) -> int:
    """Parameters of train_gpt.GPT, tie counted once: wte (padded rows) + wpe + blocks + ln_f.
    Per block: 2 LayerNorms (2d each with bias) + c_attn 3d²+3d + attn c_proj d²+d + c_fc 4d²+4d + c_proj 4d²+d."""
    d, b = m.n_embd, int(m.bias)
    ln = d * (1 + b)
    block = 2 * ln + 12 * d * d + b * 9 * d
    return m.padded_vocab_size * d + m.block_size * d + m.n_layer * block + ln


def law_params(m: ModelConfig) -> int:
    """N as the loss laws here count it (the prior's predictions, the ladder's points, the ladder's predictions):
    every parameter but the position table."""
    return count_params(m) - m.block_size * m.n_embd
