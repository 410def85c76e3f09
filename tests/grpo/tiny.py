"""A tiny random Llama with a character-level tokenizer and a ChatML-like template, built offline in ~0.1 s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-=?.:")
SPECIAL = ["<pad>", "<eos>", "<bos>"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    hf.chat_template = TEMPLATE
    return hf


def tiny_llama(seed: int = 0, layers: int = 2, hidden: int = 64, tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(SPECIAL) + len(CHARS), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                      tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg).eval()


@dataclass(frozen=True)
class Example:
    """Shaped like evals.tasks.Example: the loop only reads .prompt; rewards may read the rest."""
    task: str
    id: str
    prompt: list
    answer: str
    meta: dict = field(default_factory=dict)


def examples(n: int = 16) -> list[Example]:
    return [Example("tiny", str(i), [{"role": "user", "content": f"{i}+{i}=?"}], str(2 * i)) for i in range(n)]


def count_char(char: str):
    """A reward paying the share of completion characters equal to `char` (learnable by a random model)."""
    def reward(completions: list[str], exs: list[Any]) -> list[float]:
        return [c.count(char) / max(len(c), 1) for c in completions]
    return reward
