"""bench/snapshot.sh: the copy of the working tree that the GPU scripts' `launch` runs `work` from."""
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "snapshot.sh"


def make_tree(root: Path) -> None:
    for rel, text in {"src/pkg/mod.py": "x = 1\n", "bench/job.sh": "echo hi\n", "results/a.json": "{}",
                      ".gpu-c0/part0000": "chunk", ".gpu-bundle/vllm.tar.xz.0": "b", ".whl/w.whl": "w",
                      ".git/HEAD": "ref", ".venv/bin/python": "", ".venv-vllm/x": "", ".gitignore": "*.pyc\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_copy_keeps_the_tree_and_leaves_out_what_the_calls_carry(tmp_path):
    tree, dest = tmp_path / "tree", tmp_path / "copy"
    make_tree(tree)
    (dest / "stale").mkdir(parents=True)                     # an older copy's leftovers are removed
    done = subprocess.run(["bash", str(SCRIPT), str(dest)], cwd=tree, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(dest)
    kept = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert kept == [".gitignore", "bench/job.sh", "results/a.json", "src/pkg/mod.py"]
    (tree / "src/pkg/mod.py").unlink()                       # the live tree changing leaves the copy as it was
    assert (dest / "src/pkg/mod.py").read_text() == "x = 1\n"


def test_without_a_destination_it_says_how_to_call_it(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "usage: bash bench/snapshot.sh DEST" in done.stderr
