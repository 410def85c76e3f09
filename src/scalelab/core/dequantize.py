"""A checked GGUF -> a plain bf16 safetensors folder (config, weights, tokenizer, chat template, source record).

transformers dequantizes the GGUF (`gguf_file=`) into float32 weights but leaves a `quantization_config` on the
model, which `save_pretrained` refuses; core.gguf_cache.plain_copy rebuilds the class from the config and copies
the state dict in, cast to bf16 (round to nearest even, the same rounding a bf16 hub checkpoint went through).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from scalelab.core.gguf_check import GgufInfo
from scalelab.core.gguf_cache import load_gguf, write_plain_folder
from scalelab.core.wheelparts import ModelError


def dequantized_model(gguf: Path, info: GgufInfo):
    """(float32 model, tokenizer) for `gguf`, with the head tied only when the file has no output.weight and the
    chat template the file carries."""
    model, tokenizer = load_gguf(gguf)
    packed = [n for n, p in model.state_dict().items() if not p.is_floating_point()]
    if packed:  # a transformers that keeps GGUF blocks packed (a kernel found) would save them as such
        raise ModelError(f"{gguf}: transformers kept {len(packed)} tensors packed (e.g. {packed[0]}); "
                         "a dequantized copy is needed")
    model.config.tie_word_embeddings = not info.has_output_weight
    if info.chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = info.chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def dequantize_to_folder(gguf: Path, info: GgufInfo, out: Path, source: dict,
                         dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the folder atomically; `source` gains the seconds the dequantization took."""
    t0 = time.perf_counter()
    model, tokenizer = dequantized_model(gguf, info)
    seconds = time.perf_counter() - t0
    return write_plain_folder(model, tokenizer, out, {**source, "dequantize_s": round(seconds, 1)}, dtype)
