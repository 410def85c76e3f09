"""A finished (or stopped) run's policy as a plain HF folder: the base model with the checkpoint's trained weights
(LoRA merged into the base weights), so any engine can serve it, e.g. `scalelab evals battery --model <folder>`
for the out-of-domain checks the run's own held-out split does not cover.

    export_run(run_dir, out) -> ExportRecord      <out>/config.json, model.safetensors, tokenizer, scalelab_export.json

The record is also written into the run folder (export.json): the run's results travel without its weights (a
LoRA adapter with its optimizer state is too large to commit), so the folder keeps the exported weights' sha256.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from scalelab.core.hfmodel import load_causal_lm
from scalelab.core.gguf_cache import sha256_file
from scalelab.core.jsonio import write_json
from scalelab.grpo.checkpoint import CheckpointError, find_checkpoint, load_trainable
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.parts import prepare_policy
from scalelab.grpo.weightsync import write_model_folder

RECORD = "scalelab_export.json"
RUN_RECORD = "export.json"  # the same record, in the run folder


@dataclass(frozen=True)
class ExportRecord:
    run_dir: str
    base_model: str
    weights_version: int  # optimizer steps behind the exported weights
    lora_merged: bool
    weight_bytes: int
    safetensors_sha256: str


def export_run(run_dir: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16,
               model_and_tokenizer: tuple[Any, Any] | None = None) -> ExportRecord:
    """The run's checkpointed policy merged into a plain folder at `out`. `model_and_tokenizer`: the base model
    already loaded (tests); by default it is loaded by the run config's model name, on CPU."""
    run_dir, out = Path(run_dir), Path(out)
    ckpt = find_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(f"{run_dir / 'checkpoint.json'}: not found; `grpo export` exports a run's checkpoint")
    cfg = load_grpo_config(run_dir / "config.toml")
    cfg = replace(cfg, loss=replace(cfg.loss, log_kl=False, kl_coef=0.0))  # no reference copy is needed here
    model, tokenizer = model_and_tokenizer or load_causal_lm(cfg.model.name, cfg.model.dtype, "cpu",
                                                             cfg.model.cache_dir or None)
    policy, _ = prepare_policy(model, cfg)
    version = int(load_trainable(ckpt, policy)["next_step"])
    nbytes = write_model_folder(policy, tokenizer, out, dtype, merge_lora=cfg.model.lora.enabled)
    record = ExportRecord(str(run_dir), cfg.model.name, version, cfg.model.lora.enabled, nbytes,
                          sha256_file(out / "model.safetensors"))
    write_json(out / RECORD, asdict(record))
    write_json(run_dir / RUN_RECORD, {**asdict(record), "out": str(out)})
    return record
