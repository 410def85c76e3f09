"""bench/val_subset_shift.py: which val prefix the old B*T*world stride scored, and its unigram price, by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.pretrain.prepare import UNIGRAM_COUNTS_FILE, save_counts
from scalelab.pretrain.shards import write_shard
from tests.bench_script import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("val_subset_shift")


def test_stride_prefix_by_hand(bench):
    assert bench.stride_prefix_tokens(1_308_622, 10_485_760, 64, 1024) == 19 * 65_536
    assert bench.stride_prefix_tokens(1_308_622, 10_485_760, 256, 1024) == 4 * 262_144
    assert bench.stride_prefix_tokens(1_308_622, 1_048_576, 128, 1024) == 1_048_576  # a budget of whole strides
    assert bench.stride_prefix_tokens(100, 0, 3, 4, world=2) == 96                    # 0: the whole split


def test_shift_is_the_unigram_price_of_the_shorter_prefix(bench, tmp_path):
    # 9 windows of T=2 (targets val[1:19]); B=2 scores 4 strides (16 targets), B=4 two (16), B=3 three (18)
    val = [0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0]
    write_shard(tmp_path / "val_000000.bin", np.array(val))
    save_counts(tmp_path / UNIGRAM_COUNTS_FILE, np.array([1, 2, 3]))  # q = (2, 3, 4) / 9
    out = bench.shifts(tmp_path, 0, [3, 2], 2)
    ce = lambda ts: -sum(math.log((2, 3, 4)[t] / 9) for t in ts) / len(ts)  # noqa: E731
    assert out["rows"]["3"]["tokens_scored"] == 18 and out["rows"]["2"]["tokens_scored"] == 16
    assert out["rows"]["2"]["shift_vs_baseline"] == pytest.approx(ce(val[1:17]) - ce(val[1:19]))
