"""Random-weight models with real architectures, written as HF folders that both HF and vLLM load: for speed
measurements (rollout throughput, weight-sync cost) only the shapes matter, so no weights need to travel.

Shapes are named; the vocabulary is the tokenizer's (a Qwen2.5 shape with SmolLM2's 49,152-token tokenizer
when no Qwen tokenizer is at hand: the embedding and head shrink, the blocks are exact). "tiny" pairs a 2-layer
Llama with a character-level tokenizer built offline, for CPU plumbing runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

# Hidden sizes from the models' own config.json files (Qwen/Qwen2.5-1.5B-Instruct, Qwen/Qwen2.5-7B-Instruct,
# HuggingFaceTB/SmolLM2-135M).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                   "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                     "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "smollm2-135m": {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                     "max_position_embeddings": 8192, "rope_theta": 100_000.0, "rms_norm_eps": 1e-5,
                     "tie_word_embeddings": True},
    "tiny": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
             "tie_word_embeddings": True},
}

CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-*=?.:,\n")
SPECIAL = ["<pad>", "<eos>", "<bos>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def char_tokenizer(chars: Sequence[str] = CHARS) -> Any:
    """One token per character, ids 0-2 special (pad, eos, bos), unknown characters -> pad, with a plain chat
    template."""
    # lazy: tokenizers comes with transformers, needed only here
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers takes seconds to import
    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def model_config(shape: str, tokenizer: Any) -> Any:
    from transformers import AutoConfig  # lazy: transformers takes seconds to import
    if shape not in SHAPES:
        raise ValueError(f"model shape {shape!r}; known: {', '.join(SHAPES)}")
    spec = dict(SHAPES[shape])
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return AutoConfig.for_model(spec.pop("model_type"), vocab_size=len(tokenizer), eos_token_id=eos,
                                pad_token_id=pad, bos_token_id=tokenizer.bos_token_id, **spec)


def random_model(shape: str, tokenizer: Any, dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    """Initialised on `device` directly (a 1.5B init on CPU takes minutes), seeded."""
    from transformers import AutoModelForCausalLM  # lazy: transformers takes seconds to import
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(shape, tokenizer), dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def write_random_folder(shape: str, tokenizer_dir: str | None, out: str | Path, dtype: torch.dtype = torch.bfloat16,
                        device: str = "cpu", seed: int = 0) -> Path:
    """An HF folder (config, tokenizer, safetensors) of a random model; kept when it already exists."""
    from transformers import AutoTokenizer  # lazy: transformers takes seconds to import
    out = Path(out)
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else char_tokenizer()
    model = random_model(shape, tokenizer, dtype, device, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
