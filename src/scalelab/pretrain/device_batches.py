"""The training stream's micro-batches on the device, one ahead of use.

From pageable host memory, CUDA synchronizes the stream before a host-to-device copy (the CUDA runtime API's
"API synchronization behavior"), so every micro-batch copied that way waits for all the GPU work queued before it,
and the GPU then idles while the host launches the next forward. A profile of the recipe
(bench/gpu_pretrain_profile.py) shows these waits: idle GPU after each copy, and more at each step's start while
the host cuts the first batch.

Here each batch goes through pinned memory (PyTorch's caching host allocator keeps a pinned block until the copy
out of it has run, so the asynchronous copy is safe), and the next batch is cut and queued while the GPU still
runs the current one's kernels: `prefetch` after the backward is launched, `next_batch` to take it. The stream
position saved in a checkpoint is that of the first batch not yet trained on, so a resumed run reads the batch
that was prefetched but not used.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from scalelab.pretrain.shards import StreamPosition, TokenStream


def to_device(x: np.ndarray, y: np.ndarray, device: torch.device,
              pinned: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) on `device`; on CUDA through pinned memory (`pinned`), so the copies do not wait for the queued
    kernels."""
    if device.type != "cuda" or not pinned:
        return torch.from_numpy(x).to(device, non_blocking=True), torch.from_numpy(y).to(device, non_blocking=True)
    return tuple(torch.from_numpy(a).pin_memory().to(device, non_blocking=True) for a in (x, y))


class DeviceBatches:
    """A TokenStream's batches on the device with at most one prefetched; `state()` as the stream's, for the
    checkpoint, at the first batch not yet taken. ahead=False (train.batch_prefetch): each batch read when taken,
    from pageable memory, as a plain loader does (the baseline of the prefetch's A/B)."""

    def __init__(self, stream: TokenStream, device: torch.device, ahead: bool = True):
        self.stream, self.device, self.ahead = stream, device, ahead
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self._pending_from: StreamPosition | None = None  # the stream's position before the pending batch

    def prefetch(self) -> None:
        """Cut the next batch and queue its copy (no-op when one is already pending, or not reading ahead)."""
        if self.ahead:
            self._load()

    def _load(self) -> None:
        if self._pending is None:
            self._pending_from = self.stream.pos
            self._pending = to_device(*self.stream.next_batch(), self.device, self.ahead)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) on the device: the prefetched one, or one read now."""
        self._load()
        batch, self._pending, self._pending_from = self._pending, None, None
        return batch

    def state(self) -> dict:
        return dataclasses.asdict(self._pending_from or self.stream.pos)
