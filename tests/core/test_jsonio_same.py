"""`.same` pointers: a committed record that repeats another (up to a few top-level fields) is stored as a pointer,
reads back byte for byte through every reader, and a changed or missing target is an error, never a substitute."""
from __future__ import annotations

import json
import subprocess

import pytest

from scalelab.core.jsonio import (AmbiguousStored, find_stored, iter_jsonl, open_text, read_bytes, read_json,
                                  stored, write_json)
from scalelab.core.recordgz import duplicates, main, pack, patch_between, point

EXAMPLES = [{"id": f"q/{i}", "text": "é" * i, "correct": i % 3 == 0} for i in range(40)]


def _eval(folder, wall_s, **extra):
    write_json(folder / "eval" / "base.json", {"policy": "base", "examples": EXAMPLES, "wall_s": wall_s, **extra})
    return (folder / "eval" / "base.json").read_bytes()


def test_a_patched_repeat_reads_back_byte_for_byte(tmp_path):
    _eval(tmp_path / "a", 23.156213071000025)
    b = _eval(tmp_path / "b", 29.403779729999997)
    pack(tmp_path / "a" / "eval" / "base.json", ".xz")
    (copy, kept, patch), = duplicates([tmp_path], 0)
    assert (copy, kept, patch) == (tmp_path / "b/eval/base.json", tmp_path / "a/eval/base.json",
                                   {"wall_s": 29.403779729999997})
    pointer = point(copy, kept, patch)
    assert sorted(p.name for p in (tmp_path / "b" / "eval").iterdir()) == ["base.json.same"]
    assert json.loads(pointer.read_text())["same_as"] == "../../a/eval/base.json"
    assert stored(copy) == pointer and read_bytes(copy) == b
    assert read_json(copy)["wall_s"] == 29.403779729999997 and read_json(copy)["examples"] == EXAMPLES
    with open_text(copy) as f:
        assert f.read() == b.decode()
    assert find_stored(tmp_path, "*.json") == [tmp_path / "a/eval/base.json", copy]


def test_an_exact_repeat_needs_no_patch_and_jsonl_follows_too(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "m.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    (copy, kept, patch), = duplicates([tmp_path], 0)
    point(copy, kept, patch)
    assert "patch" not in json.loads((tmp_path / "b" / "m.jsonl.same").read_text())
    assert list(iter_jsonl(tmp_path / "b" / "m.jsonl")) == EXAMPLES


def test_only_near_repeats_in_write_json_form_become_pointers():
    a = {"examples": EXAMPLES, "wall_s": 1.0, "n": 1, "k": "x", "z": 0}
    text = lambda d: (json.dumps(d, indent=2) + "\n").encode()  # noqa: E731
    assert patch_between(text(a), text({**a, "wall_s": 2.5, "n": 2})) == {"wall_s": 2.5, "n": 2}
    assert patch_between(text(a), text({**a, "wall_s": 2.5, "n": 2, "k": "y", "z": 1})) is None  # 4 fields differ
    assert patch_between(text(a), text({**a, "examples": EXAMPLES[:-1]})) == {"examples": EXAMPLES[:-1]}
    assert patch_between(text(a), json.dumps({**a, "wall_s": 2.5}).encode()) is None  # not how write_json writes
    assert patch_between(text(a), text(dict(reversed(list(a.items()))))) is None  # other key order
    assert patch_between(b"[1, 2]\n", b"[1, 3]\n") is None


def test_a_changed_target_is_an_error_naming_both(tmp_path):
    _eval(tmp_path / "a", 1.0)
    _eval(tmp_path / "b", 2.0)
    point(*duplicates([tmp_path], 0)[0])
    _eval(tmp_path / "a", 1.0, extra_field=True)
    with pytest.raises(ValueError, match=r"b/eval/base\.json\.same: .*a/eval/base\.json no longer has the content"):
        read_json(tmp_path / "b" / "eval" / "base.json")


def test_a_missing_target_a_chain_and_a_pointer_beside_a_packed_form_are_refused(tmp_path):
    _eval(tmp_path / "a", 1.0)
    _eval(tmp_path / "b", 2.0)
    _eval(tmp_path / "c", 3.0)
    for copy, kept, patch in duplicates([tmp_path], 0):
        point(copy, kept, patch)
    ptr_c = tmp_path / "c" / "eval" / "base.json.same"
    ptr_c.write_text(json.dumps({**json.loads(ptr_c.read_text()), "same_as": "../../b/eval/base.json"}))
    with pytest.raises(FileNotFoundError, match="itself a pointer"):
        read_bytes(tmp_path / "c" / "eval" / "base.json")
    (tmp_path / "a" / "eval" / "base.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"b/eval/base\.json\.same: points to .*a/eval/base\.json"):
        read_bytes(tmp_path / "b" / "eval" / "base.json")
    (tmp_path / "b" / "eval" / "base.json.xz").write_bytes(b"")
    with pytest.raises(AmbiguousStored):
        stored(tmp_path / "b" / "eval" / "base.json")
    (tmp_path / "b" / "eval" / "base.json.xz").unlink()
    (tmp_path / "b" / "eval" / "base.json.same").write_text("{not json")
    with pytest.raises(ValueError, match=r"base\.json\.same: not a record pointer"):
        read_bytes(tmp_path / "b" / "eval" / "base.json")


def test_dedup_is_staged_in_git_and_small_records_are_left(tmp_path, capsys):
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    _eval(tmp_path / "a", 1.0)
    _eval(tmp_path / "b", 2.0)
    pack(tmp_path / "a" / "eval" / "base.json", ".xz"), pack(tmp_path / "b" / "eval" / "base.json", ".xz")
    git("add", "-A")
    assert main([str(tmp_path), "--dedup", "--min-kib", "1000"]) == 0  # smaller than 1 MB: nothing
    assert "0 bytes saved" in capsys.readouterr().out
    assert main([str(tmp_path), "--dedup", "--min-kib", "0"]) == 0
    staged = git("diff", "--cached", "--name-status").stdout.decode().split("\n")
    assert "A\tb/eval/base.json.same" in staged and "A\ta/eval/base.json.xz" in staged
    assert not any(line.endswith("b/eval/base.json.xz") for line in staged)
    assert read_json(tmp_path / "b" / "eval" / "base.json")["wall_s"] == 2.0
