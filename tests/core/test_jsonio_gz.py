"""Gzip-transparent readers: a record stored as <name>.gz reads exactly as the plain file did."""
from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from scalelab.core.jsonio import (append_jsonl, find_stored, iter_jsonl, logical, open_text, read_bytes, read_json,
                                  read_jsonl, stored, write_json)
from scalelab.core.recordgz import candidates, gzip_bytes, main, pack
from scalelab.core.rundir import RunDir


def test_gzipped_json_and_jsonl_read_as_plain(tmp_path):
    write_json(tmp_path / "a.json", {"x": [1, 2.5, "é"]})
    for i in range(3):
        append_jsonl(tmp_path / "m.jsonl", {"step": i})
    plain_json, plain_rows = read_json(tmp_path / "a.json"), read_jsonl(tmp_path / "m.jsonl")
    pack(tmp_path / "a.json"), pack(tmp_path / "m.jsonl")
    assert not (tmp_path / "a.json").exists() and (tmp_path / "a.json.gz").is_file()
    assert read_json(tmp_path / "a.json") == plain_json == {"x": [1, 2.5, "é"]}
    assert [r["step"] for r in iter_jsonl(tmp_path / "m.jsonl")] == [0, 1, 2] == [r["step"] for r in plain_rows]
    with open_text(tmp_path / "m.jsonl") as f:
        assert f.readline() == '{"step": 0}\n'
    assert stored(tmp_path / "a.json") == tmp_path / "a.json.gz" and logical(tmp_path / "a.json.gz").name == "a.json"


def test_plain_file_wins_over_a_stale_gz(tmp_path):
    write_json(tmp_path / "e.json", {"v": 1})
    pack(tmp_path / "e.json")
    write_json(tmp_path / "e.json", {"v": 2})  # a re-score after the folder was compressed
    assert read_json(tmp_path / "e.json") == {"v": 2}
    pack(tmp_path / "e.json")  # packing again replaces the stale .gz
    assert read_json(tmp_path / "e.json") == {"v": 2} and not (tmp_path / "e.json").exists()


def test_missing_and_damaged_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.json: not found \(nor nope\.json\.gz nor nope\.json\.xz nor nope\.json\.same\)"):
        read_json(tmp_path / "nope.json")
    assert list(iter_jsonl(tmp_path / "nope.jsonl")) == []
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")
    whole = gzip_bytes(b'{"a": 1}' * 1000)
    (tmp_path / "cut.json.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.json\.gz: damaged gzip file"):
        read_json(tmp_path / "cut.json")
    (tmp_path / "bad.json.gz").write_bytes(gzip_bytes(b"{not json"))
    with pytest.raises(ValueError, match=r"bad\.json\.gz: invalid JSON at line 1"):
        read_json(tmp_path / "bad.json")


def test_gzip_is_deterministic_and_standard():
    data = b'{"k": "v"}\n' * 50
    a, b = gzip_bytes(data), gzip_bytes(data)
    assert a == b and gzip.decompress(a) == data
    assert a[4:8] == b"\0\0\0\0"  # mtime field of the gzip header (RFC 1952): zero, so bytes don't vary by date


def test_find_stored_lists_plain_names_once(tmp_path):
    for rel in ("r1/metrics.jsonl", "r2/metrics.jsonl", "r2/eval/base.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    pack(tmp_path / "r2" / "metrics.jsonl")
    assert find_stored(tmp_path, "metrics.jsonl") == [tmp_path / "r1/metrics.jsonl", tmp_path / "r2/metrics.jsonl"]
    assert find_stored(tmp_path, "*.json") == [tmp_path / "r2/eval/base.json"]


def test_predictions_hash_is_of_the_plain_content(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    digest = rd.write_predictions({"rows": list(range(100))})
    pack(rd.path / "predictions.json")
    assert rd.predictions_sha256() == digest == hashlib.sha256(read_bytes(rd.path / "predictions.json")).hexdigest()
    assert rd.read_optional("predictions.json")["rows"][-1] == 99


def test_recordgz_picks_by_size_and_kind(tmp_path, capsys):
    (tmp_path / "big.json").write_text(json.dumps(list(range(30_000))))  # ~200 KB
    (tmp_path / "small.json").write_text("{}")
    (tmp_path / "big.log").write_text("x" * 200_000)
    assert [p.name for p in candidates([tmp_path], 64 * 1024)] == ["big.json"]
    assert main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json.gz", "big.log", "small.json"]
    assert read_json(tmp_path / "big.json")[-1] == 29_999
    assert main([str(tmp_path / "absent")]) == 2
    assert "absent: no such file or folder" in capsys.readouterr().err
