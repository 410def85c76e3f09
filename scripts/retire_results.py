"""Take a results folder's files out of the tracked tree, keeping a record of each in the folder.

    python scripts/retire_results.py FOLDER --why "..." [--keep README.md ...] [--only "*.log.xz"]

The tracked tree has a size budget (tests/test_tree_size.py). A superseded result leaves it this way rather than
silently: every tracked file under FOLDER except the kept ones (or only those matching --only) is `git rm`-ed, and
FOLDER/retired.json lists each with its size and sha256 and the commit that still holds it (`git show COMMIT:PATH`),
so a reader can restore and verify any of them. Run on a clean HEAD: the commit recorded is HEAD, which must hold
the files as they are.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import subprocess
import sys
from pathlib import Path


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def retire(folder: Path, why: str, keep: tuple[str, ...] = ("README.md",), only: str = "*") -> dict:
    """git rm the tracked files under `folder` matching `only` but `keep` (names relative to it); write
    folder/retired.json."""
    root = Path(git("rev-parse", "--show-toplevel", cwd=folder).strip())
    if (folder / "retired.json").exists():
        raise SystemExit(f"{folder}: already has a retired.json; one record per folder")
    if git("status", "--porcelain", "--", ".", cwd=folder).strip():
        raise SystemExit(f"{folder}: uncommitted changes here; commit them first so HEAD holds what is retired")
    rel = folder.resolve().relative_to(root)
    tracked = [p for p in git("ls-files", "-z", "--", str(rel), cwd=root).split("\0") if p]
    names = {p: Path(p).relative_to(rel).as_posix() for p in tracked}
    gone = [p for p in tracked if names[p] not in (*keep, "retired.json") and fnmatch.fnmatch(names[p], only)]
    if not gone:
        raise SystemExit(f"{folder}: no tracked file to retire")
    head = git("rev-parse", "HEAD", cwd=root).strip()
    files = [{"path": names[p], "bytes": (root / p).stat().st_size,
              "sha256": hashlib.sha256((root / p).read_bytes()).hexdigest()} for p in gone]
    record = {"what": f"files of this folder no longer in the tracked tree: {why}; each is in the repository's "
                      f"history at the commit below (git show COMMIT:{rel.as_posix()}/PATH)",
              "commit": head, "command": " ".join(["python scripts/retire_results.py", *sys.argv[1:]]),
              "git_sha": head, "files": files}
    git("rm", "-q", "--", *gone, cwd=root)
    folder.mkdir(parents=True, exist_ok=True)   # git rm took the folder when nothing was kept
    (folder / "retired.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--why", required=True, help="why these results leave the tree (what supersedes them)")
    p.add_argument("--keep", action="append", default=None, help="a file (relative to FOLDER) that stays; "
                   "repeatable; default README.md")
    p.add_argument("--only", default="*", help="retire only the files matching this glob (relative to FOLDER)")
    args = p.parse_args(argv)
    record = retire(args.folder, args.why, tuple(args.keep or ["README.md"]), args.only)
    total = sum(f["bytes"] for f in record["files"])
    print(f"retired {len(record['files'])} files ({total:,} bytes) of {args.folder}; listed in "
          f"{args.folder / 'retired.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
