"""The run's checkpoint: trainable weights, optimizer, the staleness queue and the loop's own state, written
atomically (a crash mid-write keeps the previous one).

Under torchrun rank 0 writes it and every rank reads it. Nothing in it depends on the number of processes: the
weights and optimizer state are the same on every rank (the same update everywhere), and the queue holds whole
batches (every rank's shard, gathered), so a run resumes under any world size (distributed.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from scalelab.grpo.staleness import StalenessPipeline


def trainable_state(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


def save_checkpoint(path: Path, policy: Any, optimizer: torch.optim.Optimizer, next_step: int,
                    pipe: StalenessPipeline, cfg_hash: str, loop_state: dict | None = None) -> None:
    """`loop_state`: what else a resumed run must continue from (curriculum stage, queued batches' prompts)."""
    state = {"next_step": next_step, "trainable": trainable_state(policy), "optimizer": optimizer.state_dict(),
             "pipeline": pipe.state_dict(), "config_hash": cfg_hash, "loop": loop_state or {}}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_trainable(path: Path, policy: Any) -> dict:
    """Copy the checkpoint's trainable weights into `policy`; returns the whole checkpoint state."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = dict(policy.named_parameters())
    missing = sorted(set(state["trainable"]) - set(params))
    if missing:
        raise ValueError(f"{path}: {len(missing)} trained tensors have no parameter in this model, e.g. {missing[0]}")
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    return state


def load_checkpoint(path: Path, policy: Any, optimizer: torch.optim.Optimizer,
                    pipe: StalenessPipeline) -> tuple[int, str, dict]:
    """Restore weights, optimizer and queue; (next step, config hash it was made under, loop state)."""
    state = load_trainable(path, policy)
    optimizer.load_state_dict(state["optimizer"])
    pipe.load_state_dict(state["pipeline"])
    return int(state["next_step"]), str(state["config_hash"]), dict(state.get("loop", {}))
