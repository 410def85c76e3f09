"""One pass of the trainer's seeded shuffle: every train window at most once per epoch, never to two ranks, the same
permutation after a resume mid-epoch, and the step count of the time-to-target driver inside the first epoch.

Shards here hold base + 0, 1, 2, ...: a window's first token names its shard and start, so the windows a stream
serves can be counted."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.device_batches import DeviceBatches
from scalelab.pretrain.shards import PassPlan, StreamPosition, one_pass, write_shard

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_pretrain_ttt_real as real  # noqa: E402

T = 8
BASES = (0, 1000, 2000)
SIZES = (8 * 50 + 1, 8 * 25 + 5, 8 * 16 + 1)  # 50, 25 and 16 windows of T+1 tokens at stride T


@pytest.fixture
def data(tmp_path) -> Path:
    for i, (base, n) in enumerate(zip(BASES, SIZES)):
        write_shard(tmp_path / f"train_{i:06d}.bin", base + np.arange(n))
    write_shard(tmp_path / "val_000000.bin", np.arange(3 * T + 1))
    (tmp_path / "manifest.json").write_text(json.dumps({"source": "counting"}))
    return tmp_path


def every_window() -> set[int]:
    return {base + w * T for base, n in zip(BASES, SIZES) for w in range((n - 1) // T)}


def cfg_for(data: Path, batch: int, seed: int, *extra: str):
    return load_pretrain_config(None, [f"data.dir={json.dumps(str(data))}", f"train.micro_batch_size={batch}",
                                       f"model.block_size={T}", f"train.seed={seed}", "model.vocab_size=4096",
                                       "model.padded_vocab_size=4096", *extra])


def draw(stream, n: int) -> list[int]:
    """First-token ids of the windows of the next n micro-batches, checking each row is T+1 contiguous tokens."""
    out = []
    for _ in range(n):
        x, y = stream.next_batch()
        x, y = np.asarray(x), np.asarray(y)
        assert (x[:, 1:] == x[:, :-1] + 1).all() and (y == x + 1).all()
        out += x[:, 0].tolist()
    return out


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 1337])
@pytest.mark.parametrize("batch", [2, 3])
def test_an_epoch_serves_each_window_once_and_to_one_rank(data, world, seed, batch):
    cfg = cfg_for(data, batch, seed)
    plan = one_pass(SIZES, batch, T, world)
    streams = [train_gpt.make_stream(cfg, "train", r, world) for r in range(world)]  # the trainer's own streams
    per_rank = [draw(s, plan.micro_batches) for s in streams]
    assert all(s.pos.epoch == 0 for s in streams)
    served = [w for ids in per_rank for w in ids]
    assert max(Counter(served).values()) == 1                                   # no window twice, on any rank
    assert set(served) <= every_window() and len(served) == plan.micro_batches * batch * world
    left = Counter((w // 1000) for w in every_window() - set(served))           # what the epoch leaves out
    need = batch * world
    assert [left[s] for s in range(3)] == [((n - 1) // T) % need for n in SIZES]
    assert plan.windows - len(served) == sum(left.values())
    draw(streams[0], 1)                                                          # the next micro-batch: epoch 1
    assert streams[0].pos.epoch == 1


def test_the_next_epoch_is_another_permutation_of_the_same_windows(data):
    stream = train_gpt.make_stream(cfg_for(data, 2, 5), "train", 0, 1)
    plan = one_pass(SIZES, 2, T)
    first, second = draw(stream, plan.micro_batches), draw(stream, plan.micro_batches)
    assert stream.pos.epoch == 1 and len(set(first)) == len(first) and len(set(second)) == len(second)
    assert first != second and len(set(first) & set(second)) > 0.9 * len(first)


@pytest.mark.parametrize("world", [1, 2])
def test_resume_mid_epoch_continues_the_same_permutation(data, world):
    cfg, plan = cfg_for(data, 2, 11), one_pass(SIZES, 2, T, world)
    whole = [draw(train_gpt.make_stream(cfg, "train", r, world), plan.micro_batches) for r in range(world)]
    for cut in (1, plan.micro_batches // 2 + 1, plan.micro_batches - 1):  # in the first, second and last shard
        before, after = [], []
        for r in range(world):  # as the trainer: a prefetched batch not yet taken when the checkpoint is written
            batches = DeviceBatches(train_gpt.make_stream(cfg, "train", r, world), torch.device("cpu"))
            before.append(draw(batches, cut))
            batches.prefetch()
            pos = StreamPosition(**batches.state())
            after.append(draw(train_gpt.make_stream(cfg, "train", r, world, pos), plan.micro_batches - cut))
        assert [b + a for b, a in zip(before, after)] == whole


def test_trainer_one_pass_takes_each_window_once(data, tmp_path, monkeypatch):
    # grad accum 2 (total_batch_tokens = 2 micro-batches of 2 windows): steps = one_pass(...).steps
    plan = one_pass(SIZES, 2, T, 1, 2)
    cfg = cfg_for(data, 2, 3, "model.n_layer=1", "model.n_head=1", "model.n_embd=16", "train.device=cpu",
                  f"train.total_batch_tokens={4 * T}", f"train.max_steps={plan.steps}", "train.val_every=0",
                  "train.checkpoint_every=0", "schedule.warmup_steps=1",
                  f"run.out_dir={json.dumps(str(tmp_path / 'runs'))}", 'run.name="pass"')
    taken, real_next = [], DeviceBatches.next_batch

    def spy(self):
        x, y = real_next(self)
        taken.extend(x[:, 0].tolist())
        return x, y

    monkeypatch.setattr(DeviceBatches, "next_batch", spy)
    assert train_gpt.train(cfg)["steps"] == plan.steps
    assert len(taken) == plan.steps * plan.windows_per_step == len(set(taken))
    data_pos = torch.load(cfg.run_dir / "checkpoint.pt", weights_only=True)["data"]
    # 25 + 12 + 7 micro-batches taken, of 25 + 12 + 8 in the epoch: the next one is still shard 2's, epoch 0
    assert data_pos == {"shard": 2, "offset": 14, "epoch": 0}


def test_one_pass_of_the_measured_time_to_target_corpus():
    # bench/gpu_pretrain_ttt_real.sh: 30,638,617 train tokens, in shards of prepare-sharegpt-corpora.toml's
    # shard_tokens = 30,000,000 and the rest; B=64, T=1024 (gpt2-124m-fineweb-edu.toml), 131,072 tokens a step
    shards = [30_000_000, 638_617]
    plan = one_pass(shards, batch=64, seq=1024, world=1, accum=2)
    # 29,296 + 623 windows; 457 + 9 micro-batches of 64, leaving 48 + 47 windows; 466 // 2 = 233 steps
    assert plan == PassPlan(seq=1024, windows=29_919, micro_batches=466, steps=233, windows_per_step=128,
                            dropped_windows=95)
    assert plan.trained_tokens == 233 * 131_072 and plan.steps == sum(shards) // 131_072
    # the token total alone would overshoot with 128 windows a micro-step (B=128, or B=64 on 2 GPUs): 228 + 4
    # micro-batches = 232 steps, not 233; B=32 on 2 GPUs draws 64 a micro-step, as B=64 on one
    assert one_pass(shards, batch=128, seq=1024, world=1, accum=1).steps == 232 < sum(shards) // 131_072
    assert one_pass(shards, batch=64, seq=1024, world=2, accum=1).steps == 232
    assert one_pass(shards, batch=32, seq=1024, world=2, accum=2) == plan


def test_one_pass_arithmetic_by_hand():
    assert one_pass([17, 16], batch=2, seq=4) == PassPlan(4, 4 + 3, 2 + 1, 3, 2, 1)
    assert one_pass([17, 16], batch=2, seq=4, accum=2).steps == 1   # 3 micro-batches: one whole step
    assert one_pass([0, 1], batch=1, seq=4).windows == 0
    with pytest.raises(ValueError, match="batch=0"):
        one_pass([100], batch=0, seq=4)


def test_driver_steps_is_one_pass_of_the_configs_shards(data, capsys):
    sets = [f"data.dir={json.dumps(str(data))}", "train.micro_batch_size=2", f"model.block_size={T}",
            f"train.total_batch_tokens={4 * T}"]
    assert real.main(["steps", "--results", str(data), *[a for s in sets for a in ("--set", s)]]) == 0
    out, err = capsys.readouterr()
    assert int(out) == one_pass(SIZES, 2, T, 1, 2).steps == 22
    assert "of the 91 windows of 9 tokens, 3 are left out" in err
