"""xz as the second stored form: a record packed to <name>.xz (or converted from <name>.gz) reads exactly as the
plain file did, through every reader; two compressed forms of one record are refused rather than guessed between."""
from __future__ import annotations

import gzip
import json
import lzma
import subprocess

import pytest

from scalelab.core.jsonio import (AmbiguousStored, append_jsonl, find_stored, is_stored, iter_jsonl, logical,
                                  open_text, read_bytes, read_json, read_jsonl, read_text, stored, write_json)
from scalelab.core.recordgz import candidates, gzip_bytes, main, pack, xz_bytes

ROWS = [{"step": i, "text": "é" * i} for i in range(50)]


def _records(folder):
    write_json(folder / "a.json", {"x": [1, 2.5, "é"]})
    for r in ROWS:
        append_jsonl(folder / "m.jsonl", r)
    return (folder / "a.json").read_bytes(), (folder / "m.jsonl").read_bytes()


def test_xz_reads_as_plain_through_every_reader(tmp_path):
    a_plain, m_plain = _records(tmp_path)
    pack(tmp_path / "a.json", ".xz"), pack(tmp_path / "m.jsonl", ".xz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json.xz", "m.jsonl.xz"]
    assert stored(tmp_path / "a.json") == tmp_path / "a.json.xz" and is_stored(tmp_path / "m.jsonl")
    assert logical(tmp_path / "a.json.xz") == tmp_path / "a.json"
    assert read_bytes(tmp_path / "a.json") == a_plain and read_bytes(tmp_path / "m.jsonl") == m_plain
    assert read_text(tmp_path / "m.jsonl") == m_plain.decode()
    assert read_json(tmp_path / "a.json") == {"x": [1, 2.5, "é"]}
    assert list(iter_jsonl(tmp_path / "m.jsonl")) == read_jsonl(tmp_path / "m.jsonl") == ROWS
    with open_text(tmp_path / "m.jsonl") as f:
        assert [json.loads(line) for line in f] == ROWS
    assert read_json(tmp_path / "a.json.xz") == {"x": [1, 2.5, "é"]}  # the stored name itself reads too
    assert find_stored(tmp_path, "*.json*") == [tmp_path / "a.json", tmp_path / "m.jsonl"]


def test_xz_is_deterministic_and_standard():
    data = json.dumps(ROWS).encode() * 20
    a, b = xz_bytes(data), xz_bytes(data)
    assert a == b and lzma.decompress(a, format=lzma.FORMAT_XZ) == data
    assert a[:6] == b"\xfd7zXZ\x00" and len(a) < len(gzip_bytes(data))  # the .xz magic; smaller than gzip -9


def test_packing_twice_gives_the_same_bytes(tmp_path):
    first, second = tmp_path / "1", tmp_path / "2"
    for d in (first, second):
        d.mkdir()
        _records(d)
        pack(d / "m.jsonl", ".xz")
    assert (first / "m.jsonl.xz").read_bytes() == (second / "m.jsonl.xz").read_bytes()


def test_gz_converts_to_xz_with_the_same_content(tmp_path):
    _, m_plain = _records(tmp_path)
    pack(tmp_path / "m.jsonl")
    gz = tmp_path / "m.jsonl.gz"
    assert read_bytes(tmp_path / "m.jsonl") == m_plain
    p = pack(gz, ".xz")
    assert p.dest == tmp_path / "m.jsonl.xz" and p.bytes_before == len(gzip_bytes(m_plain)) > p.bytes_after
    assert not gz.exists() and read_bytes(tmp_path / "m.jsonl") == m_plain
    assert (tmp_path / "m.jsonl.xz").read_bytes() == xz_bytes(m_plain)  # as if packed from the plain file


def test_conversion_is_staged_in_git(tmp_path):
    """The index follows (git ls-files is what the tree-size cap measures). Git pairs renames by content, and the
    .gz and .xz bytes share none, so status shows a delete and an add even though recordgz git mv-ed the file."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    _, m_plain = _records(tmp_path)
    pack(tmp_path / "m.jsonl")
    subprocess.run([*git, "add", "m.jsonl.gz"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "gz"], cwd=tmp_path, check=True)
    assert main([str(tmp_path), "--xz"]) == 0  # a.json is small: left plain; m.jsonl.gz is converted
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert {"D  m.jsonl.gz", "A  m.jsonl.xz"} <= set(status.splitlines())
    assert read_bytes(tmp_path / "m.jsonl") == m_plain and (tmp_path / "a.json").is_file()


def test_recordgz_xz_picks_plain_and_gz_records(tmp_path):
    (tmp_path / "big.json").write_text(json.dumps(list(range(30_000))))  # ~200 KB
    (tmp_path / "small.jsonl.gz").write_bytes(gzip_bytes(b"{}\n"))     # already judged bulky: converted
    (tmp_path / "stale.json").write_text("{}")                          # plain wins over its .gz: left alone
    (tmp_path / "stale.json.gz").write_bytes(gzip_bytes(b"[]"))
    (tmp_path / "run.log.gz").write_bytes(gzip_bytes(b"not a record"))
    assert [p.name for p in candidates([tmp_path], 64 * 1024)] == ["big.json"]
    assert [p.name for p in candidates([tmp_path], 64 * 1024, ".xz")] == ["big.json", "small.jsonl.gz"]
    assert main([str(tmp_path), "--xz"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json.xz", "run.log.gz", "small.jsonl.xz",
                                                         "stale.json", "stale.json.gz"]
    assert read_json(tmp_path / "big.json")[-1] == 29_999 and read_jsonl(tmp_path / "small.jsonl") == [{}]


def test_damaged_xz_names_the_file(tmp_path):
    whole = xz_bytes(json.dumps(ROWS).encode() * 20)
    (tmp_path / "cut.json.xz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.json\.xz: damaged xz file: "):
        read_json(tmp_path / "cut.json")
    (tmp_path / "junk.jsonl.xz").write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 64)
    with pytest.raises(ValueError, match=r"junk\.jsonl\.xz: damaged xz file: "):
        list(iter_jsonl(tmp_path / "junk.jsonl"))
    (tmp_path / "bad.json.xz").write_bytes(xz_bytes(b"{not json"))
    with pytest.raises(ValueError, match=r"bad\.json\.xz: invalid JSON at line 1"):
        read_json(tmp_path / "bad.json")


def test_plain_wins_and_gz_beside_xz_is_refused(tmp_path):
    (tmp_path / "r.json.gz").write_bytes(gzip_bytes(b'{"v": "gz"}'))
    (tmp_path / "r.json.xz").write_bytes(xz_bytes(b'{"v": "xz"}'))
    for read in (read_json, read_bytes, is_stored, open_text):
        with pytest.raises(AmbiguousStored, match=r"r\.json\.gz and .*r\.json\.xz both hold this record"):
            read(tmp_path / "r.json")
    with pytest.raises(AmbiguousStored):
        find_stored(tmp_path, "*.json")
    write_json(tmp_path / "r.json", {"v": "plain"})  # a re-score after the folder was compressed: the newest
    assert read_json(tmp_path / "r.json") == {"v": "plain"} and find_stored(tmp_path, "*.json") == [tmp_path / "r.json"]
    pack(tmp_path / "r.json", ".xz")  # packing replaces both stale forms
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json.xz"] and read_json(tmp_path / "r.json") == {"v": "plain"}


def test_gz_over_a_stale_xz_is_repacked(tmp_path):
    """Writers never write .xz, so a .gz beside one is the newer: recordgz --xz resolves the refusal with it."""
    (tmp_path / "r.json.xz").write_bytes(xz_bytes(b'{"v": "old"}'))
    (tmp_path / "r.json.gz").write_bytes(gzip_bytes(b'{"v": "new"}'))
    assert main([str(tmp_path / "r.json.gz"), "--xz"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json.xz"] and read_json(tmp_path / "r.json") == {"v": "new"}


def test_missing_names_every_form(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.json: not found \(nor nope\.json\.gz nor nope\.json\.xz nor nope\.json\.same\)"):
        read_json(tmp_path / "nope.json")
    assert gzip.decompress(gzip_bytes(b"x")) == b"x"
