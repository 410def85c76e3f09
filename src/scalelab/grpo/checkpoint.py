"""The run's checkpoint: trainable weights, optimizer, the staleness queue and the loop's own state, written
atomically (a crash mid-write keeps the previous one).

Two files, neither unpickled: `checkpoint.json` holds everything that is not a tensor (step, config hash,
queue, loop state, the optimizer's hyperparameters) and names a tensor file `checkpoint-<step>.pt`, a flat
{name: tensor} map read with `torch.load(weights_only=True)`. A checkpoint from an untrusted folder can
therefore hold data but no code. The JSON is the commit point: the tensor file is complete before the JSON
that names it replaces the previous one, and older tensor files are removed only after.

Under torchrun rank 0 writes it and every rank reads it. Nothing in it depends on the number of processes: the
weights and optimizer state are the same on every rank (the same update everywhere), and the queue holds whole
batches (every rank's shard, gathered), so a run resumes under any world size (distributed.py)."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from scalelab.core.errors import ModelError
from scalelab.grpo.staleness import StalenessPipeline

CHECKPOINT = "checkpoint.json"  # in the run folder
LEGACY = "checkpoint.pt"  # one pickled file, as earlier versions wrote it: never loaded
FORMAT = 2


class CheckpointError(ModelError, ValueError):
    """A checkpoint that is missing, refused (it is not plain data) or does not fit this model."""


def trainable_state(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------------------------------------
# JSON <-> nested state with tensors. Tuples and dicts with non-string keys (the optimizer's per-parameter
# state is keyed by int) are tagged so that they come back as they went in.


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint state {where}: {type(obj).__name__} is not a tensor or plain data")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, path) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        if obj["__tensor__"] not in tensors:
            raise CheckpointError(f"{path}: names tensor {obj['__tensor__']!r}, which its tensor file lacks")
        return tensors[obj["__tensor__"]]
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors, path) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors, path): _decode(v, tensors, path) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors, path) for k, v in obj.items()}


# ---------------------------------------------------------------------------------------------
# files


def _replace_atomically(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_checkpoint(path: Path, policy: Any, optimizer: torch.optim.Optimizer, next_step: int,
                    pipe: StalenessPipeline, cfg_hash: str, loop_state: dict | None = None) -> None:
    """`path`: the run's checkpoint.json. `loop_state`: what else a resumed run must continue from
    (curriculum stage, queued batches' prompts)."""
    state = {"next_step": next_step, "trainable": trainable_state(policy), "optimizer": optimizer.state_dict(),
             "pipeline": pipe.state_dict(), "config_hash": cfg_hash, "loop": loop_state or {}}
    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": FORMAT, "tensors": f"checkpoint-{next_step}.pt", "state": _encode(state, tensors, "state")}
    tensor_file = path.with_name(doc["tensors"])
    _replace_atomically(tensor_file, lambda tmp: torch.save(tensors, tmp))
    _replace_atomically(path, lambda tmp: tmp.write_text(json.dumps(doc)))
    for old in path.parent.glob("checkpoint-*.pt"):
        if old != tensor_file:
            old.unlink(missing_ok=True)


def find_checkpoint(run_dir: Path) -> Path | None:
    """The run folder's checkpoint.json, None when it has none; a checkpoint in the old pickled format is an
    error rather than a fresh start that would overwrite the run."""
    path = Path(run_dir) / CHECKPOINT
    if path.is_file():
        return path
    if (Path(run_dir) / LEGACY).is_file():
        raise CheckpointError(f"{Path(run_dir) / LEGACY}: a pickled checkpoint from an earlier version; it is not "
                              f"loaded (unpickling can run code); start the run in a new folder")
    return None


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: not found (named by {CHECKPOINT} beside it)") from e
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused, not a plain tensor file ({first})") from e
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise CheckpointError(f"{path}: not a {{name: tensor}} map")
    return tensors


def load_state(path: Path) -> dict:
    """The whole checkpoint state (tensors in place) from a checkpoint.json."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tensors"), str):
        raise CheckpointError(f"{path}: not a checkpoint of format {FORMAT}")
    tensor_file = path.with_name(Path(doc["tensors"]).name)  # never a path outside the run folder
    return _decode(doc["state"], _load_tensors(tensor_file), path)


def load_trainable(path: Path, policy: Any) -> dict:
    """Copy the checkpoint's trainable weights into `policy`; returns the whole checkpoint state."""
    state = load_state(path)
    params = dict(policy.named_parameters())
    missing = sorted(set(state["trainable"]) - set(params))
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} trained tensors have no parameter in this model, "
                              f"e.g. {missing[0]}")
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
