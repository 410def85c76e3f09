"""Chunked transfer: split -> join gives back the same bytes; a damaged, missing or misplaced chunk is refused
with its name; chunk sizes respect the limit; a folder goes over as a deterministic tar and comes back whole."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.core import chunks
from scalelab.core.chunks import ChunkError, default_chunk_bytes, join, split, stage

SRC = Path(__file__).resolve().parents[2] / "src"


def _payload(tmp_path: Path, n: int) -> Path:
    f = tmp_path / "model.gguf"
    f.write_bytes(os.urandom(n))
    return f


def test_round_trip_same_bytes_and_sizes(tmp_path):
    f = _payload(tmp_path, 10_000)
    m = split(f, tmp_path / "out", 3_000)
    assert [c.size_bytes for c in m.chunks] == [3000, 3000, 3000, 1000]  # 10,000 = 3 x 3,000 + 1,000
    assert [c.name for c in m.chunks] == [f"model.gguf.part{i:04d}" for i in range(4)]
    assert m.sha256 == hashlib.sha256(f.read_bytes()).hexdigest() and m.total_bytes == 10_000
    assert all((tmp_path / "out" / c.name).stat().st_size <= 3_000 for c in m.chunks)
    join([tmp_path / "out"], tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == f.read_bytes()


def test_exact_multiple_and_empty_file(tmp_path):
    m = split(_payload(tmp_path, 6_000), tmp_path / "a", 3_000)
    assert [c.size_bytes for c in m.chunks] == [3000, 3000]
    (tmp_path / "empty").write_bytes(b"")
    m = split(tmp_path / "empty", tmp_path / "b", 3_000)
    assert [c.size_bytes for c in m.chunks] == [0]
    join([tmp_path / "b"], tmp_path / "empty.back")
    assert (tmp_path / "empty.back").read_bytes() == b""


def test_chunks_spread_over_call_folders_join(tmp_path):
    """Each call's chunk lands in its own folder (stage), the final call joins them all."""
    f = _payload(tmp_path, 7_001)
    m = split(f, tmp_path / "out", 2_000)
    calls = []
    for i in range(len(m.chunks)):
        staged = stage(tmp_path / "out", i, tmp_path / "stage")
        names = sorted(p.name for p in (tmp_path / "stage").iterdir())
        assert names == sorted([staged.name, "model.gguf.manifest.json"])
        calls.append(tmp_path / f"call{i}")
        (tmp_path / "stage").rename(calls[-1])
    join(calls, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == f.read_bytes()


def test_flipped_byte_is_refused_naming_the_chunk(tmp_path):
    split(_payload(tmp_path, 9_000), tmp_path / "out", 3_000)
    part = tmp_path / "out" / "model.gguf.part0001"
    data = bytearray(part.read_bytes())
    data[1234] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(ChunkError, match=r"model\.gguf\.part0001 \(2 of 3\) sha256 .* \(damaged"):
        join([tmp_path / "out"], tmp_path / "back")
    assert not (tmp_path / "back").exists() and not (tmp_path / "back.joining").exists()


def test_missing_chunk_is_refused_naming_it(tmp_path):
    split(_payload(tmp_path, 9_000), tmp_path / "out", 3_000)
    (tmp_path / "out" / "model.gguf.part0002").unlink()
    with pytest.raises(ChunkError, match=r"chunk model\.gguf\.part0002 \(3 of 3\): missing"):
        join([tmp_path / "out"], tmp_path / "back")


def test_reordered_chunks_are_refused(tmp_path):
    split(_payload(tmp_path, 6_000), tmp_path / "out", 3_000)
    a, b = tmp_path / "out" / "model.gguf.part0000", tmp_path / "out" / "model.gguf.part0001"
    a.rename(tmp_path / "swap")
    b.rename(a)
    (tmp_path / "swap").rename(b)
    with pytest.raises(ChunkError, match=r"model\.gguf\.part0000 \(1 of 2\) sha256 .* another chunk in its place"):
        join([tmp_path / "out"], tmp_path / "back")


def test_truncated_chunk_is_refused_by_size(tmp_path):
    split(_payload(tmp_path, 6_000), tmp_path / "out", 3_000)
    part = tmp_path / "out" / "model.gguf.part0001"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(ChunkError, match=r"part0001 \(2 of 2\) has 2999 bytes, the manifest says 3000"):
        join([tmp_path / "out"], tmp_path / "back")


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_folder_round_trip_and_determinism(tmp_path):
    src = tmp_path / "vllm-bundle"
    (src / "site" / "pkg").mkdir(parents=True)
    (src / "site" / "pkg" / "__init__.py").write_text("x = 1\n")
    (src / "site" / "big.bin").write_bytes(os.urandom(50_000))
    (src / "unpack.sh").write_text("#!/bin/sh\necho ok\n")
    (src / "unpack.sh").chmod(0o755)
    (src / "empty-dir").mkdir()
    m1 = split(src, tmp_path / "out1", 16_384)
    assert m1.kind == "dir" and len(m1.chunks) >= 4 and all(c.size_bytes <= 16_384 for c in m1.chunks)
    os.utime(src / "unpack.sh", (1, 1))  # mtimes are not in the tar: the same folder gives the same chunks
    assert split(src, tmp_path / "out2", 16_384).sha256 == m1.sha256
    join([tmp_path / "out1"], tmp_path / "back")
    assert _tree(tmp_path / "back") == _tree(src)
    assert (tmp_path / "back" / "empty-dir").is_dir() and os.access(tmp_path / "back" / "unpack.sh", os.X_OK)


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(ChunkError, match="one \\*.manifest.json among the inputs, found 0"):
        join([tmp_path], tmp_path / "x")
    f = _payload(tmp_path, 10)
    split(f, tmp_path / "out", 4)
    with pytest.raises(ChunkError, match="already holds chunks of model.gguf"):
        split(f, tmp_path / "out", 4)
    with pytest.raises(ChunkError, match="already exists"):
        join([tmp_path / "out"], f)
    with pytest.raises(ChunkError, match="index 3 out of range: model.gguf has chunks 0..2"):
        stage(tmp_path / "out", 3, tmp_path / "stage")
    (tmp_path / "out" / "model.gguf.manifest.json").write_text("{}")
    with pytest.raises(ChunkError, match="not a chunk manifest"):
        join([tmp_path / "out"], tmp_path / "y")


def test_default_chunk_leaves_room_for_the_tree():
    mib = 2**20
    assert default_chunk_bytes(9 * mib) == 49 * mib            # 60 - 9 - 2 slack
    assert default_chunk_bytes(int(8.9 * mib)) == 49 * mib     # rounded down to whole MiB: 49.1 -> 49
    assert default_chunk_bytes(None) == 46 * mib               # outside a checkout: the 12 MB cap, 60 - 11.44 - 2
    tree = chunks.tracked_tree_bytes()
    if tree is not None:
        assert default_chunk_bytes(tree) + tree + chunks.SLACK_BYTES <= chunks.CALL_LIMIT_BYTES


def test_cli_runs_with_only_src_on_the_path(tmp_path):
    f = _payload(tmp_path, 5_000)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SRC)}
    run = lambda *a: subprocess.run([sys.executable, "-S", "-m", "scalelab.core.chunks", *a], env=env, cwd=tmp_path,
                                    capture_output=True, text=True)  # noqa: E731  -S: no site-packages at all
    r = run("split", str(f), "out", "--max-mib", str(2_000 / 2**20))
    assert r.returncode == 0 and "in 3 chunk(s)" in r.stdout, r.stderr
    r = run("join", "back", "out")
    assert r.returncode == 0 and "verified" in r.stdout and (tmp_path / "back").read_bytes() == f.read_bytes()
    (tmp_path / "out" / "model.gguf.part0001").unlink()
    r = run("join", "back2", "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "part0001 (2 of 3): missing" in r.stderr
    assert "Default chunk size" in run("--help").stdout
