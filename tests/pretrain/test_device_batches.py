"""DeviceBatches: the stream's batches one ahead, and a checkpoint position at the first batch not trained on."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from scalelab.pretrain.device_batches import DeviceBatches, to_device
from scalelab.pretrain.shards import StreamPosition, TokenStream, write_shard

CPU = torch.device("cpu")


@pytest.fixture
def shards(tmp_path):
    paths = [tmp_path / "train_000000.bin", tmp_path / "train_000001.bin"]
    write_shard(paths[0], np.arange(40))
    write_shard(paths[1], np.arange(100, 130))
    return paths


def _stream(shards, position=None):
    return TokenStream(shards, batch=2, seq=3, position=position, shuffle_seed=7)


def test_prefetching_serves_the_stream_in_order(shards):
    plain, batches = _stream(shards), DeviceBatches(_stream(shards), CPU)
    for i in range(12):  # 6 batches in the first shard, 4 in the second, then a second epoch
        x, y = batches.next_batch()
        want_x, want_y = plain.next_batch()
        assert x.tolist() == want_x.tolist() and y.tolist() == want_y.tolist(), i
        if i % 2:
            batches.prefetch()
            batches.prefetch()  # a second prefetch keeps the pending batch, reads nothing more
    assert plain.state()["epoch"] == 1 and batches.stream.state() != plain.state()  # one batch read ahead


def test_checkpoint_position_is_the_first_batch_not_taken(shards):
    batches = DeviceBatches(_stream(shards), CPU)
    for _ in range(3):
        batches.next_batch()
    assert batches.state() == batches.stream.state()  # nothing pending: the stream's own position
    batches.prefetch()
    pending_at = batches.state()
    assert pending_at != batches.stream.state()
    resumed = DeviceBatches(_stream(shards, StreamPosition(**pending_at)), CPU)
    assert resumed.next_batch()[0].tolist() == batches.next_batch()[0].tolist()  # the prefetched batch, not lost


def test_cpu_copies_are_int64_and_owned():
    x, y = to_device(np.arange(6).reshape(2, 3), np.arange(1, 7).reshape(2, 3), CPU)
    assert x.dtype == torch.int64 and y.tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned host memory")
def test_cuda_copies_go_through_pinned_memory_and_arrive_whole():
    a = np.random.default_rng(0).integers(0, 50257, size=(64, 1024))
    x, y = to_device(a, a + 1, torch.device("cuda"))
    torch.cuda.synchronize()
    assert x.is_cuda and torch.equal(x.cpu(), torch.from_numpy(a)) and torch.equal(y.cpu(), torch.from_numpy(a + 1))


def test_without_read_ahead_each_batch_is_read_when_taken(shards):
    plain, batches = _stream(shards), DeviceBatches(_stream(shards), CPU, ahead=False)
    for _ in range(4):
        batches.prefetch()  # a no-op: nothing is read before it is taken
        assert batches.state() == plain.state() == batches.stream.state()
        assert batches.next_batch()[0].tolist() == plain.next_batch()[0].tolist()
