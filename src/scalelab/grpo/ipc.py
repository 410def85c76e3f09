"""Weights across a process boundary on one GPU as CUDA IPC handles: the trainer sends, vLLM's engine-core
process (rollout.server.engine_core='subprocess') rebuilds the tensors in place and loads them; nothing is
copied through the host."""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor


@dataclass
class IpcChunk:
    """Some weights as CUDA IPC handles (pickled), and the tensors they point into: the handles stay valid only
    while the sender holds these."""
    blob: bytes
    tensors: list[torch.Tensor]


def ipc_weight_chunks(named: Any, max_bytes: int = 1 << 29) -> Any:
    """(name, tensor) pairs as IpcChunks of at most ~max_bytes each, so the merged copies held at once stay
    bounded. torch's reduce_tensor gives, per tensor, a function and the arguments that rebuild it in another
    process on the same GPU from a cudaIpcMemHandle (the mechanism torch.multiprocessing uses)."""
    items, held, size = [], [], 0
    for name, t in named:
        t = t.contiguous()
        items.append((name, *reduce_tensor(t)))
        held.append(t)
        size += t.numel() * t.element_size()
        if size >= max_bytes:
            _sync_cuda(held)  # the receiver reads these bytes on its own stream
            yield IpcChunk(pickle.dumps(items), held)
            items, held, size = [], [], 0
    if items:
        _sync_cuda(held)
        yield IpcChunk(pickle.dumps(items), held)


def _sync_cuda(tensors: list[torch.Tensor]) -> None:
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()


def load_ipc_weights(worker: Any, blob: bytes) -> int:
    """Runs in vLLM's worker (collective_rpc): rebuild the sender's tensors from their IPC handles and load them
    through the model's own load_weights, as a checkpoint would be. Returns the number of tensors."""
    weights = [(name, rebuild(*args)) for name, rebuild, args in pickle.loads(blob)]
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights)
    _sync_cuda([t for _, t in weights])  # copied before the sender is told it may free its tensors
    return len(weights)
