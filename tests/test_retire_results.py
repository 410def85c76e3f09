"""scripts/retire_results.py in a scratch repository: the files leave the index and the disk, retired.json lists
each with the size and sha256 of the bytes `git show COMMIT:PATH` gives back, the kept files stay."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import retire_results  # noqa: E402


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    run = tmp_path / "results" / "old" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_bytes(b'{"step": 1}\n')
    (tmp_path / "results" / "old" / "README.md").write_text("old study\n")
    (tmp_path / "results" / "other.json").write_text("{}\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "results")
    return tmp_path


def test_retired_files_are_listed_with_their_hashes_and_restorable(repo):
    folder = repo / "results" / "old"
    record = retire_results.retire(folder, "superseded by new")
    head = git(repo, "rev-parse", "HEAD").strip()
    assert record["commit"] == head
    assert record["files"] == [{"path": "run/metrics.jsonl", "bytes": 12,
                                "sha256": hashlib.sha256(b'{"step": 1}\n').hexdigest()}]
    assert json.loads((folder / "retired.json").read_text()) == record
    assert not (folder / "run" / "metrics.jsonl").exists() and (folder / "README.md").read_text() == "old study\n"
    assert git(repo, "ls-files", "results").split() == ["results/old/README.md", "results/other.json"]
    restored = subprocess.run(["git", "show", f"{head}:results/old/run/metrics.jsonl"], cwd=repo,
                              capture_output=True, check=True).stdout
    assert hashlib.sha256(restored).hexdigest() == record["files"][0]["sha256"]


def test_refuses_uncommitted_changes_and_an_empty_folder(repo):
    folder = repo / "results" / "old"
    (folder / "run" / "metrics.jsonl").write_text("edited\n")
    with pytest.raises(SystemExit, match="uncommitted"):
        retire_results.retire(folder, "x")
    git(repo, "checkout", "--", ".")
    with pytest.raises(SystemExit, match="no tracked file"):
        retire_results.retire(folder, "x", keep=("README.md", "run/metrics.jsonl"))


def test_a_folder_retired_whole_keeps_its_record(repo):
    folder = repo / "results" / "old"
    record = retire_results.retire(folder, "all of it", keep=())
    assert [f["path"] for f in record["files"]] == ["README.md", "run/metrics.jsonl"]
    assert json.loads((folder / "retired.json").read_text())["files"] == record["files"]


def test_only_the_matching_files_leave(repo):
    folder = repo / "results" / "old"
    (folder / "run.log.xz").write_bytes(b"log")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "log")
    record = retire_results.retire(folder, "logs", only="*.log.xz")
    assert [f["path"] for f in record["files"]] == ["run.log.xz"]
    assert (folder / "run" / "metrics.jsonl").is_file() and not (folder / "run.log.xz").exists()


def test_dropping_an_event_keeps_the_other_lines_and_records_both_hashes(repo):
    import lzma
    folder = repo / "results" / "old"
    lines = [b'{"event": "step", "step": 1}\n', b'{"event": "gpu_samples", "u": [1, 2, 3]}\n',
             b'{"event": "step", "step": 2}\n']
    original = lzma.compress(b"".join(lines))
    (folder / "run" / "metrics.jsonl.xz").write_bytes(original)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "xz")
    record = retire_results.drop_event(folder, "only the steps are cited", "gpu_samples", "*.jsonl.xz")
    [entry] = record["files"]
    left = (folder / "run" / "metrics.jsonl.xz").read_bytes()
    assert lzma.decompress(left) == lines[0] + lines[2]
    assert entry["path"] == "run/metrics.jsonl.xz" and entry["dropped_lines"] == 1
    assert entry["sha256"] == hashlib.sha256(original).hexdigest()
    assert entry["kept_sha256"] == hashlib.sha256(left).hexdigest() and entry["kept_bytes"] == len(left)
    assert (folder / "run" / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'   # not matched by --only
    with pytest.raises(SystemExit, match="one record per folder"):
        retire_results.drop_event(folder, "again", "gpu_samples", "*.jsonl.xz")


def test_dropping_an_event_from_a_file_that_is_not_json_lines_names_it(repo):
    folder = repo / "results" / "old"
    with pytest.raises(SystemExit, match=r"results/old/README.md: line 1 is not a JSON object"):
        retire_results.drop_event(folder, "x", "gpu_samples", "*.md")
    assert (folder / "README.md").read_text() == "old study\n" and not (folder / "retired.json").exists()
