"""A trained LoRA adapter -> a merged HF folder the serve job can serve, and an optional push to the HF Hub.

Merging folds W + (alpha/r) B A into each adapted weight (Hu et al. 2021, sec. 4.1: no inference latency),
so the folder is a plain model of the base architecture: transformers and vLLM load it by path.
The Hub token is read from the environment (HF_TOKEN) only and is never written to logs or files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from scalelab.core.hfmodel import load_causal_lm, sha256_file

BASE_RECORD = "scalelab_base.json"  # written beside a saved adapter: the base model name it was trained on
WEIGHTS = "adapter_model.safetensors"
# beside the weights: their sha256, which names them where they are not (run folders packed without weights,
# a committed run whose adapter is kept by hash): the battery's tuned records are keyed by it
WEIGHTS_SHA = WEIGHTS + ".sha256"


def write_base_record(adapter_dir: Path, base: str) -> None:
    (adapter_dir / BASE_RECORD).write_text(json.dumps({"base_model": base}, indent=2) + "\n")


def write_weights_sha(adapter_dir: Path) -> str:
    digest = sha256_file(adapter_dir / WEIGHTS)
    (adapter_dir / WEIGHTS_SHA).write_text(digest + "\n")
    return digest


def recorded_weights_sha(adapter_dir: Path) -> str | None:
    """The sha256 written when the weights were saved, or None; a malformed record is an error naming it."""
    path = Path(adapter_dir) / WEIGHTS_SHA
    if not path.is_file():
        return None
    digest = path.read_text().strip()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{path}: not a sha256 hex digest: {digest[:80]!r}")
    return digest


def base_of(adapter_dir: str | Path) -> str:
    path = Path(adapter_dir) / BASE_RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: pass the base model explicitly (--base)")
    return json.loads(path.read_text())["base_model"]


def merge_adapter(base: str, adapter: str | Path, out: str | Path, cache_dir: str = "",
                  dtype: str = "float32") -> Path:
    """Load base (registry name, hub id or folder), apply the adapter, merge, save safetensors + tokenizer."""
    from peft import PeftModel  # lazy: peft is optional (the tune extra)
    model, tokenizer = load_causal_lm(base, dtype=dtype, device="cpu", cache_dir=cache_dir or None)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out = Path(out)
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


@dataclass(frozen=True)
class PushResult:
    repo_id: str
    url: str


def push_folder(folder: str | Path, repo_id: str, private: bool = True, endpoint: str = "",
                api_factory: Callable[..., object] | None = None) -> PushResult:
    """Upload a folder (adapter or merged model) to the Hub with the token from HF_TOKEN. endpoint '' = the
    Hub itself; a URL = a server speaking its API (a mirror, or the tests' loopback stand-in)."""
    token = os.environ.get("HF_TOKEN")
    if not token:
        raise RuntimeError("hub push needs the environment variable HF_TOKEN (it is read from there only)")
    if api_factory is None:
        from huggingface_hub import HfApi as api_factory  # lazy: the hub client only for hub ids
    api = api_factory(token=token, **({"endpoint": endpoint} if endpoint else {}))
    api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="scalelab dpo adapter")
    return PushResult(repo_id, str(getattr(info, "commit_url", info)))
