"""llm.c token shards: the file format, header validation, and the rank-strided TokenStream."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from scalelab.pretrain.shards import (HEADER_BYTES, MAGIC, ShardError, StreamPosition, TokenStream, list_shards,
                                      ValWindows, manifest_hash, read_header, read_shard, write_shard)


def _write_raw(path, header_ints: list[int], tokens: list[int]) -> None:
    header = np.zeros(256, dtype="<i4")
    header[:len(header_ints)] = header_ints
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


def test_round_trip_bytes_and_sha(tmp_path):
    path = tmp_path / "train_000000.bin"
    sha = write_shard(path, np.array([50256, 0, 65535, 15496], dtype=np.int64))
    data = path.read_bytes()
    assert sha == hashlib.sha256(data).hexdigest()
    assert len(data) == 1024 + 4 * 2
    assert np.frombuffer(data[:12], "<i4").tolist() == [20240520, 1, 4]
    assert data[1024:] == bytes([0x50, 0xC4, 0, 0, 0xFF, 0xFF, 0x88, 0x3C])  # 50256 = 0xC450, little-endian
    assert read_header(path) == 4
    assert read_shard(path).tolist() == [50256, 0, 65535, 15496]
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write leaves no temp file


def test_empty_shard(tmp_path):
    path = tmp_path / "val_000000.bin"
    write_shard(path, np.array([], dtype=np.uint16))
    assert path.stat().st_size == HEADER_BYTES
    assert read_shard(path).tolist() == []


@pytest.mark.parametrize("bad", [65536, -1])
def test_token_outside_uint16_refused(tmp_path, bad):
    path = tmp_path / "x.bin"
    with pytest.raises(ShardError, match=r"token ids must lie in \[0, 65535\]"):
        write_shard(path, np.array([1, bad]))
    assert not path.exists()


def test_bad_magic(tmp_path):
    path = tmp_path / "x.bin"
    _write_raw(path, [20240521, 1, 2], [1, 2])
    with pytest.raises(ShardError, match=f"{path}: bad magic 20240521 \\(expected {MAGIC}\\)"):
        read_header(path)


def test_bad_version(tmp_path):
    path = tmp_path / "x.bin"
    _write_raw(path, [MAGIC, 2, 2], [1, 2])
    with pytest.raises(ShardError, match="unsupported version 2 \\(expected 1\\)"):
        read_header(path)


def test_truncated_payload(tmp_path):
    path = tmp_path / "x.bin"
    write_shard(path, np.arange(10))
    path.write_bytes(path.read_bytes()[:-3])  # cut mid-token
    with pytest.raises(ShardError, match="header says 10 tokens \\(1044 bytes\\) but the file has 1041 bytes"):
        read_header(path)


def test_header_count_disagrees_with_size(tmp_path):
    path = tmp_path / "x.bin"
    _write_raw(path, [MAGIC, 1, 5], [1, 2, 3])
    with pytest.raises(ShardError, match="header says 5 tokens \\(1034 bytes\\) but the file has 1030 bytes"):
        read_header(path)


def test_file_shorter_than_header(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ShardError, match="100 bytes is shorter than the 1024-byte header"):
        read_header(path)


def test_missing_shard(tmp_path):
    with pytest.raises(ShardError, match="shard not found"):
        read_header(tmp_path / "nope.bin")


def test_list_shards_and_manifest_hash(tmp_path):
    for name in ["train_000001.bin", "train_000000.bin", "val_000000.bin"]:
        write_shard(tmp_path / name, np.arange(3))
    (tmp_path / "train_000002.bin.tmp").write_bytes(b"partial")
    assert [p.name for p in list_shards(tmp_path, "train")] == ["train_000000.bin", "train_000001.bin"]
    with pytest.raises(ShardError, match="no test_\\*.bin shards"):
        list_shards(tmp_path, "test")
    with pytest.raises(ShardError, match="no manifest.json"):
        manifest_hash(tmp_path)
    (tmp_path / "manifest.json").write_text('{"a": 1}\n')
    assert manifest_hash(tmp_path) == hashlib.sha256(b'{"a": 1}\n').hexdigest()


@pytest.fixture
def two_shards(tmp_path):
    a, b = tmp_path / "train_000000.bin", tmp_path / "train_000001.bin"
    write_shard(a, np.arange(30))
    write_shard(b, np.arange(100, 120))
    return [a, b]


def test_stream_rank_striding(two_shards):
    # B=2, T=3, world=2: each step rank r reads tokens [offset + 6r, offset + 6r + 7); offset += 12
    r0 = TokenStream(two_shards, batch=2, seq=3, rank=0, world=2)
    r1 = TokenStream(two_shards, batch=2, seq=3, rank=1, world=2)
    x0, y0 = r0.next_batch()
    x1, y1 = r1.next_batch()
    assert x0.tolist() == [[0, 1, 2], [3, 4, 5]] and y0.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert x1.tolist() == [[6, 7, 8], [9, 10, 11]] and y1.tolist() == [[7, 8, 9], [10, 11, 12]]
    assert x0.dtype == np.int64
    assert r0.state() == r1.state() == {"shard": 0, "offset": 12, "epoch": 0}
    assert r1.next_batch()[0].tolist() == [[18, 19, 20], [21, 22, 23]]


def test_stream_rollover_and_wrap(two_shards):
    s = TokenStream(two_shards, batch=2, seq=3, rank=0, world=2)
    s.next_batch()
    s.next_batch()  # offsets 0 and 12 fit in 30 tokens; 24 + 13 > 30 does not
    x, _ = s.next_batch()
    assert x.tolist() == [[100, 101, 102], [103, 104, 105]]
    assert s.state() == {"shard": 1, "offset": 12, "epoch": 0}
    x, _ = s.next_batch()  # 12 + 13 > 20: wraps back to the first shard, a new epoch
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert s.state() == {"shard": 0, "offset": 12, "epoch": 1}


def test_stream_resumes_from_position(two_shards):
    s = TokenStream(two_shards, batch=1, seq=4, position=StreamPosition(shard=1, offset=8))
    x, y = s.next_batch()
    assert x.tolist() == [[108, 109, 110, 111]] and y.tolist() == [[109, 110, 111, 112]]
    assert s.state() == {"shard": 1, "offset": 12, "epoch": 0}


def test_shuffled_stream_is_a_seeded_permutation_shared_by_ranks(two_shards):
    # T=3: shard 0 (30 tokens) holds (30-1)//3 = 9 windows; shard 1 (20 tokens) holds 6.
    r0 = TokenStream(two_shards, batch=2, seq=3, rank=0, world=2, shuffle_seed=7)
    r1 = TokenStream(two_shards, batch=2, seq=3, rank=1, world=2, shuffle_seed=7)
    one = TokenStream(two_shards, batch=4, seq=3, shuffle_seed=7)  # the same global batch in one process
    perm = np.random.default_rng([7, 0, 0]).permutation(9)
    x0, y0 = r0.next_batch()
    x1, _ = r1.next_batch()
    assert x0[:, 0].tolist() == [3 * w for w in perm[:2]] and x1[:, 0].tolist() == [3 * w for w in perm[2:4]]
    assert (y0 == x0 + 1).all()  # windows are contiguous tokens: y is x shifted by one
    assert one.next_batch()[0].tolist() == np.concatenate([x0, x1]).tolist()
    r0.next_batch()  # windows 4..7 of the permutation
    assert r0.state() == {"shard": 0, "offset": 8, "epoch": 0}
    x, _ = r0.next_batch()  # 8 + 4 > 9 windows: shard 1, in its own permutation
    assert x[:, 0].tolist() == [100 + 3 * w for w in np.random.default_rng([7, 0, 1]).permutation(6)[:2]]
    resumed = TokenStream(two_shards, batch=2, seq=3, rank=0, world=2, shuffle_seed=7,
                          position=StreamPosition(**r0.state()))
    assert resumed.next_batch()[0].tolist() == r0.next_batch()[0].tolist()


def test_stream_refuses_shards_too_small(two_shards):
    with pytest.raises(ShardError, match="fewer than 61 tokens"):
        TokenStream(two_shards, batch=3, seq=10, world=2)


def test_val_windows_span_shards_and_ignore_the_batch(tmp_path):
    write_shard(tmp_path / "val_000000.bin", np.arange(10))  # windows of T+1=4 at stride 3: [0..3] [3..6] [6..9]
    write_shard(tmp_path / "val_000001.bin", np.arange(100, 108))  # [100..103] [103..106]
    files = list_shards(tmp_path, "val")
    v = ValWindows(files, seq=3)
    assert v.count == 5
    assert v.rows(2, 2).tolist() == [[6, 7, 8, 9], [100, 101, 102, 103]]
    assert ValWindows(files, seq=3, budget_tokens=7).count == 2  # 7 // 3
    x, y, w = next(ValWindows(files, seq=3, budget_tokens=100).batches(8))  # the budget caps at the split
    assert (x[:, 0].tolist(), y[:, -1].tolist(), w) == ([0, 3, 6, 100, 103], [3, 6, 9, 103, 106], 5)


def test_val_windows_split_over_ranks_once_each_with_matched_calls(tmp_path):
    write_shard(tmp_path / "val_000000.bin", np.arange(31))  # 10 windows at T=3
    v = ValWindows(list_shards(tmp_path, "val"), seq=3)
    r0, r1 = list(v.batches(3, 0, 2)), list(v.batches(3, 1, 2))  # 4 batches: 3, 3, 3, 1 windows
    assert len(r0) == len(r1) == 2
    assert [w for *_, w in r0] == [3, 3] and [w for *_, w in r1] == [3, 1]
    seen = sorted(int(x[i, 0]) for x, _, w in r0 + r1 for i in range(w))
    assert seen == [3 * k for k in range(10)]
    assert [w for *_, w in v.batches(4, 1, 3)] == [4]  # 3 batches (4, 4, 2) over 3 ranks: one each
    assert [w for *_, w in v.batches(4, 4, 5)] == [0]  # over 5 ranks the last two re-read one with weight 0


def test_val_windows_refuse_a_split_shorter_than_a_window(tmp_path):
    write_shard(tmp_path / "val_000000.bin", np.arange(3))
    with pytest.raises(ShardError, match="no window of block_size\\+1 = 4 tokens"):
        ValWindows(list_shards(tmp_path, "val"), seq=3)
