"""A tiny random Llama with a character-level tokenizer and a ChatML-like template, built offline in ~0.1 s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-=?.:")
SPECIAL = ["<pad>", "<eos>", "<bos>"]


def tiny_tokenizer():
    from scalelab.grpo.randmodel import char_tokenizer
    return char_tokenizer(CHARS)


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


def with_eos_bias(model, bias: float, eos_id: int = 1):
    """Untie the head and give it a bias of `bias` on EOS only: a random model that stops after a few tokens, so
    there is room for its completions to grow."""
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.get_output_embeddings().weight)
        head.bias.zero_()
        head.bias[eos_id] = bias
    model.config.tie_word_embeddings = False
    model.lm_head = head
    return model


def tiny_parts(cfg, seed: int = 0, eos_bias: float = 0.0):
    """The run's Parts with the tiny model in place of cfg.model: real task examples (every curriculum stage, the
    held-out split when eval.at_end or eval.every) and real reward functions from the config."""
    from scalelab.grpo.parts import Parts, heldout_examples, prepare_policy, reward_functions, training_stages
    model = tiny_llama(seed=seed)
    if eos_bias:
        model = with_eos_bias(model, eos_bias)
    policy, reference = prepare_policy(model, cfg)
    stages = training_stages(cfg)
    held = heldout_examples(cfg) if cfg.eval.at_end or cfg.eval.every else None
    return Parts(policy, tiny_tokenizer(), stages[-1], reward_functions(cfg), reference,
                 stages if len(stages) > 1 else None, held)
