"""The one mapping between our GPT's weights and HF `GPT2LMHeadModel`'s, shared by parity and export.

Our GPT already uses HF's parameter names (train_gpt.py), so the mapping is not a rename. It differs in:
  * layout: HF GPT-2 keeps the original OpenAI TF checkpoint's `Conv1D` modules, whose weight is [in, out];
    ours are `nn.Linear`, [out, in]. The four matmul weights per block are transposed.
  * vocab rows: our wte/lm_head has `padded_vocab_size` rows (50304, a multiple of 128 for matmul tiles);
    HF has exactly `vocab_size` (50257). The padded rows never enter the softmax, so slicing them off
    (ours -> HF) and padding with zeros (HF -> ours) keep the model's distribution unchanged.
  * tying: both tie lm_head to wte; HF's checkpoints store only wte, so lm_head is never written.
"""
from __future__ import annotations

from dataclasses import asdict, fields

import torch

from scalelab.core import errors
from scalelab.pretrain.config import GPT2_VOCAB, ModelConfig

# Matmul weights stored as Conv1D [in, out] by HF GPT-2 (modeling_gpt2.py), nn.Linear [out, in] by us.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
VOCAB_KEYS = ("transformer.wte.weight",)
TIED_KEY = "lm_head.weight"
# Wrapper prefixes that torch.compile / DDP add to parameter names.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
KNOWN_MODEL_KEYS = frozenset(f.name for f in fields(ModelConfig))


class GPT2MappingError(errors.ModelError, ValueError):
    """A model config or checkpoint that HF GPT-2 cannot express; the message names the field."""


def check_gpt2_expressible(model_config: dict) -> None:
    """Refuse, naming the field, any architecture option HF GPT2LMHeadModel has no way to represent."""
    unknown = sorted(set(model_config) - KNOWN_MODEL_KEYS)
    if unknown:
        raise GPT2MappingError(f"model config field 'model.{unknown[0]}' is unknown to the GPT-2 weight mapping "
                               f"(known: {', '.join(sorted(KNOWN_MODEL_KEYS))}); refusing to guess how HF GPT-2 "
                               "would express it")
    if model_config.get("bias") is False:
        raise GPT2MappingError("model config field 'model.bias' is false: HF GPT2LMHeadModel always has biases "
                               "in its Conv1D and LayerNorm layers, so a bias-free model cannot be exported as GPT-2")
    if model_config.get("vocab_size") != GPT2_VOCAB:
        raise GPT2MappingError(f"model config field 'model.vocab_size' is {model_config.get('vocab_size')}, not "
                               f"{GPT2_VOCAB}: the exported folder carries GPT-2's BPE tokenizer, which would not "
                               "match the embedding rows")
    if model_config.get("padded_vocab_size", GPT2_VOCAB) < GPT2_VOCAB:
        raise GPT2MappingError(f"model config field 'model.padded_vocab_size' is "
                               f"{model_config.get('padded_vocab_size')} < vocab_size {GPT2_VOCAB}")


def gpt2_config(model_cfg: ModelConfig, **extra):
    """The HF GPT2Config of the same architecture; dropout probabilities follow ours (0 for pretraining)."""
    from transformers import GPT2Config  # lazy: transformers takes seconds to import
    check_gpt2_expressible(asdict(model_cfg))
    return GPT2Config(
        vocab_size=model_cfg.vocab_size, n_positions=model_cfg.block_size, n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer, n_head=model_cfg.n_head, n_inner=None,  # None = 4 * n_embd, as ours
        activation_function="gelu_new",  # the tanh GELU approximation, F.gelu(approximate="tanh") in ours
        resid_pdrop=model_cfg.dropout, embd_pdrop=model_cfg.dropout, attn_pdrop=model_cfg.dropout,
        layer_norm_epsilon=1e-5,  # nn.LayerNorm's default eps, used by our GPT
        bos_token_id=GPT2_VOCAB - 1, eos_token_id=GPT2_VOCAB - 1, tie_word_embeddings=True, **extra)


def strip_wrappers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        out[name] = tensor
    return out


def _is_conv1d(name: str) -> bool:
    return name.startswith("transformer.h.") and name.endswith(CONV1D_SUFFIXES)


def to_hf_state_dict(model_or_state_dict, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our GPT (module or state dict) -> HF GPT2LMHeadModel names, layouts and 50257 vocab rows, without the
    tied lm_head. Tensors are new contiguous copies (safetensors refuses shared or strided storage)."""
    check_gpt2_expressible(asdict(model_cfg))
    sd = model_or_state_dict.state_dict() if isinstance(model_or_state_dict, torch.nn.Module) else model_or_state_dict
    sd = strip_wrappers(sd)
    out = {}
    for name, tensor in sd.items():
        if name == TIED_KEY:
            if not torch.equal(tensor, sd["transformer.wte.weight"]):
                raise GPT2MappingError("lm_head.weight differs from transformer.wte.weight: HF GPT-2 ties them, "
                                       "an untied head cannot be exported")
            continue
        tensor = tensor.detach()
        if name in VOCAB_KEYS:
            tensor = tensor[: model_cfg.vocab_size]
        elif _is_conv1d(name):
            tensor = tensor.t()
        out[name] = tensor.contiguous().clone()
    return out


def from_hf_state_dict(hf_state_dict: dict[str, torch.Tensor], model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF GPT2LMHeadModel state dict -> ours: Conv1D transposed, wte zero-padded to padded_vocab_size rows.
    The tied lm_head is left out; loading into our GPT fills it through the tie."""
    out = {}
    for name, tensor in hf_state_dict.items():
        if name == TIED_KEY or name.endswith((".attn.bias", ".attn.masked_bias")):  # tie; causal-mask buffers
            continue
        tensor = tensor.detach()
        if name in VOCAB_KEYS:
            pad = tensor.new_zeros(model_cfg.padded_vocab_size - tensor.shape[0], tensor.shape[1])
            tensor = torch.cat([tensor, pad])
        elif _is_conv1d(name):
            tensor = tensor.t()
        out[name] = tensor.contiguous()
    return out


def load_into_ours(model: torch.nn.Module, hf_state_dict: dict[str, torch.Tensor]) -> None:
    """Copy HF weights into our GPT; every one of our parameters must be covered (only the tie may be absent)."""
    missing, unexpected = model.load_state_dict(from_hf_state_dict(hf_state_dict, model.cfg), strict=False)
    missing = [k for k in missing if k != TIED_KEY]
    if missing or unexpected:
        raise GPT2MappingError(f"HF -> ours weight mapping incomplete: missing {missing}, unexpected {unexpected}")
