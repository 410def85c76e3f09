"""Trainer -> rollout engine weight sync, each method timed (ms) and sized (bytes).

| method         | engines                    | what moves                                                        |
|----------------|----------------------------|-------------------------------------------------------------------|
| shared         | hf                         | nothing: the engine generates with the trainer's own module        |
| inplace        | hf (own copy), colocated   | every weight, LoRA merged, copied into the engine's tensors        |
| safetensors    | vllm_server                | every weight written to a folder; the server reloads it in place   |
|                |                            | (vLLM dev-mode /collective_rpc reload_weights) or is restarted     |
|                |                            | (forced when tied embeddings train: reload_leaves_stale_head)      |
| lora_adapter   | vllm_server                | the adapter only (peft folder); /v1/load_lora_adapter under a new  |
|                |                            | name per version, so no request mixes two versions                 |
| nccl           | vllm_server on GPUs other  | every weight, LoRA merged, broadcast GPU to GPU into the server's  |
|                | than the trainer's         | workers by vLLM's RL weight-transfer API (ncclsync.py); no file    |

nccl is the path for a 7B model on separate rollout GPUs: its cost is ~bytes / link bandwidth (NVLink), which
the file path upper-bounds. It needs CUDA and an importable vLLM (the server's release) in the trainer process.

The orders of magnitude: an in-place reload costs about a file write and read of the weights, a server restart
tens of times that (the engine starts again), a LoRA adapter only its own small tensors, and a colocated in-place
copy on a GPU a device-to-device copy; the rollout bench and the GRPO runs record each method's time.

The full weights of a LoRA policy are W + (alpha / r) B A computed on the fly (peft's get_delta_weight); the
adapters are never merged into the trained model in place, since merge followed by unmerge is not exact in
floating point and would drift the weights being trained.
"""
from __future__ import annotations

import copy
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja")


@dataclass(frozen=True)
class SyncRecord:
    method: str
    version: int
    sync_ms: float
    bytes: int
    restarted: bool = False  # the server had to be relaunched to take the new weights


class SyncTarget(Protocol):
    """What a rollout engine offers to the sync methods it supports."""
    name: str
    weights_version: int
    sync_methods: tuple[str, ...]


def base_model(model: Any) -> torch.nn.Module:
    """The HF model under a peft wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def merged_named_weights(model: Any, dtype: torch.dtype | None = None,
                         merge_lora: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every weight of the policy, LoRA deltas added (unless merge_lora is False: the
    base weights), adapters left untouched."""
    base = base_model(model)
    modules = dict(base.named_modules())
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            out_name, tensor = name.replace(".base_layer.", "."), p.detach()
            if merge_lora and name.endswith(".base_layer.weight"):
                layer = modules[name.removesuffix(".base_layer.weight")]
                for adapter in layer.active_adapters:
                    tensor = tensor + layer.get_delta_weight(adapter)
            yield out_name, tensor.to(dtype) if dtype is not None else tensor


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def write_model_folder(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype | None = None,
                       merge_lora: bool = True) -> int:
    """An HF folder (config, tokenizer, model.safetensors) of the policy; returns the weight bytes."""
    from safetensors.torch import save_file  # lazy: safetensors.torch imports torch
    folder.mkdir(parents=True, exist_ok=True)
    weights = {n: t.contiguous() for n, t in merged_named_weights(model, dtype, merge_lora)}
    cfg = copy.deepcopy(base_model(model).config)
    if dtype is not None:
        cfg.dtype = dtype
    cfg.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tmp = folder / "model.safetensors.tmp"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / "model.safetensors")
    return sum(tensor_bytes(t) for t in weights.values())


def copy_config_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in CONFIG_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


# ---------------------------------------------------------------------------------------------
# the methods


def sync_shared(policy: Any, engine: Any, version: int, workdir: Path) -> tuple[int, bool]:
    if base_model(engine.model) is not base_model(policy):
        raise ValueError("weight_sync 'shared' needs the engine to hold the trainer's own module")
    return 0, False


def sync_inplace(policy: Any, engine: Any, version: int, workdir: Path) -> tuple[int, bool]:
    sizes: list[int] = []

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in merged_named_weights(policy, engine.weights_dtype):
            sizes.append(tensor_bytes(t))
            yield name, t
    engine.load_named_weights(counted())
    return sum(sizes), False


def sync_safetensors(policy: Any, engine: Any, version: int, workdir: Path) -> tuple[int, bool]:
    folder = workdir / f"v{version:06d}"
    copy_config_files(engine.model_dir, folder)
    from safetensors.torch import save_file  # lazy: safetensors.torch imports torch
    weights = {n: t.contiguous() for n, t in merged_named_weights(policy, engine.weights_dtype)}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    restarted = engine.reload_from_folder(folder)
    _drop_older(workdir, keep=folder)
    return sum(tensor_bytes(t) for t in weights.values()), restarted


def sync_lora_adapter(policy: Any, engine: Any, version: int, workdir: Path) -> tuple[int, bool]:
    folder = workdir / f"lora-v{version:06d}"
    policy.save_pretrained(str(folder))
    nbytes = sum(f.stat().st_size for f in folder.glob("adapter_model*"))
    engine.load_lora(folder, f"policy-v{version}")
    _drop_older(workdir, keep=folder)
    return nbytes, False


def sync_nccl(policy: Any, engine: Any, version: int, workdir: Path) -> tuple[int, bool]:
    # materialized: the server is told every name, dtype and shape before the first byte is broadcast
    weights = list(merged_named_weights(policy, engine.weights_dtype))
    engine.send_by_nccl(weights)
    return sum(tensor_bytes(t) for _, t in weights), False


def _drop_older(workdir: Path, keep: Path) -> None:
    # The engine has read the folder by now; older versions are never read again.
    for old in workdir.iterdir():
        if old.is_dir() and old != keep:
            shutil.rmtree(old, ignore_errors=True)


SYNC_METHODS: dict[str, Callable[[Any, Any, int, Path], tuple[int, bool]]] = {
    "shared": sync_shared, "inplace": sync_inplace, "safetensors": sync_safetensors,
    "lora_adapter": sync_lora_adapter, "nccl": sync_nccl}

def sync_weights(method: str, policy: Any, engine: SyncTarget, version: int, workdir: Path) -> SyncRecord:
    """Move the trainer's current weights (`version`) into the engine; time and size the move."""
    if method not in SYNC_METHODS:
        raise ValueError(f"weight sync {method!r}; allowed: {', '.join(SYNC_METHODS)}")
    if method not in engine.sync_methods:
        raise ValueError(f"engine {engine.name!r} does not support weight sync {method!r}; "
                         f"it supports: {', '.join(engine.sync_methods)}")
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    nbytes, restarted = SYNC_METHODS[method](policy, engine, version, workdir)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    engine.weights_version = version
    return SyncRecord(method, version, ms, nbytes, restarted)
