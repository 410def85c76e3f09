"""The tracked tree stays small enough to travel with every call to the GPU machine (~60 MiB a call, tree
included): under 12 MB in all (each real-model run keeps every item's generation, ~0.8 MB as xz, and a record that
repeats another is a `.same` pointer: `python -m scalelab.core.recordgz --dedup results`), and no bulky per-record
JSON left uncompressed (scalelab.core.recordgz --xz packs them)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_TREE_BYTES = 12_000_000
MAX_PLAIN_RECORD_BYTES = 100_000


def tracked_sizes() -> dict[str, int]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    names = [n for n in out.decode().split("\0") if n]
    if not names:
        pytest.skip("git lists no tracked files here")
    # a file deleted in the work tree but still in the index weighs nothing on the wire
    return {n: (REPO / n).stat().st_size for n in names if (REPO / n).is_file()}


def test_tracked_tree_under_12_mb():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    biggest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total < MAX_TREE_BYTES, (f"tracked tree is {total:,} bytes (limit {MAX_TREE_BYTES:,}); largest: "
                                    + ", ".join(f"{n} ({sizes[n]:,})" for n in biggest))


def test_no_bulky_plain_json_records():
    sizes = tracked_sizes()
    bulky = sorted(n for n, s in sizes.items() if n.endswith((".json", ".jsonl")) and s > MAX_PLAIN_RECORD_BYTES)
    assert not bulky, (f"{bulky[0]}: {sizes[bulky[0]]:,} bytes of uncompressed JSON (over {MAX_PLAIN_RECORD_BYTES:,}); "
                       f"pack it with `python -m scalelab.core.recordgz --xz {bulky[0]}`"
                       + (f" (and {len(bulky) - 1} more)" if len(bulky) > 1 else ""))


def test_committed_records_are_xz_packed():
    """A run writes its per-item records as .gz; committed, they are repacked as .xz (a quarter to a third
    smaller), so results/ holds no gzipped JSON record."""
    gz = sorted(n for n in tracked_sizes() if n.startswith("results/") and n.endswith((".json.gz", ".jsonl.gz")))
    assert not gz, (f"{gz[0]}: a gzipped record in results/; repack it with `python -m scalelab.core.recordgz --xz "
                    f"{gz[0]}`" + (f" (and {len(gz) - 1} more)" if len(gz) > 1 else ""))
