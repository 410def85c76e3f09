"""Take a results folder's files out of the tracked tree, keeping a record of each in the folder.

    python scripts/retire_results.py FOLDER --why "..." [--keep README.md ...] [--only "*.log.xz"]
    python scripts/retire_results.py FOLDER --why "..." --drop-event gpu_samples --only "metrics.jsonl.xz"

The tracked tree has a size budget (tests/test_tree_size.py). A superseded result leaves it this way rather than
silently: every tracked file under FOLDER except the kept ones (or only those matching --only) is `git rm`-ed, and
FOLDER/retired.json lists each with its size and sha256 and the commit that still holds it (`git show COMMIT:PATH`),
so a reader can restore and verify any of them. Run on a clean HEAD: the commit recorded is HEAD, which must hold
the files as they are.

--drop-event EVENT keeps the files (only those matching --only, JSON lines, plain or .xz) but rewrites each without
its lines whose "event" is EVENT (e.g. a 20 Hz GPU-utilization series of a run whose other records are what a study
cites); retired.json then lists each file's original size and sha256 beside what is left and how many lines went.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _tracked(folder: Path) -> tuple[Path, Path, list[str]]:
    """(repository root, folder relative to it, its tracked paths); refuses a folder already retired from or with
    uncommitted changes, so that HEAD holds the bytes the record describes."""
    root = Path(git("rev-parse", "--show-toplevel", cwd=folder).strip())
    if (folder / "retired.json").exists():
        raise SystemExit(f"{folder}: already has a retired.json; one record per folder")
    if git("status", "--porcelain", "--", ".", cwd=folder).strip():
        raise SystemExit(f"{folder}: uncommitted changes here; commit them first so HEAD holds what is retired")
    rel = folder.resolve().relative_to(root)
    return root, rel, [p for p in git("ls-files", "-z", "--", str(rel), cwd=root).split("\0") if p]


def _record(what: str, root: Path, rel: Path, files: list[dict]) -> dict:
    head = git("rev-parse", "HEAD", cwd=root).strip()
    return {"what": f"{what}; each is in the repository's history at the commit below "
                    f"(git show COMMIT:{rel.as_posix()}/PATH)",
            "commit": head, "command": " ".join(["python scripts/retire_results.py", *sys.argv[1:]]),
            "git_sha": head, "files": files}


def _event_of(line: bytes, where: str, n: int) -> object:
    try:
        return json.loads(line).get("event")
    except (json.JSONDecodeError, AttributeError) as e:
        raise SystemExit(f"{where}: line {n} is not a JSON object ({e}); --only should name JSON-lines files")


def _without_event(data: bytes, event: str, xz: bool, where: str) -> tuple[bytes, int]:
    """JSON lines (xz-compressed when `xz`) less those whose "event" is `event`; (new bytes, lines dropped)."""
    lines = (lzma.decompress(data) if xz else data).splitlines(keepends=True)
    kept = [ln for n, ln in enumerate(lines, 1) if not ln.strip() or _event_of(ln, where, n) != event]
    body = b"".join(kept)
    return (lzma.compress(body, preset=9 | lzma.PRESET_EXTREME) if xz else body), len(lines) - len(kept)


def drop_event(folder: Path, why: str, event: str, only: str) -> dict:
    """Rewrite the tracked JSON-lines files under `folder` matching `only` without their `event` lines; write
    folder/retired.json with each file's original and new size and sha256."""
    root, rel, tracked = _tracked(folder)
    files, rewritten = [], {}
    for p in tracked:   # every file read and checked before any is written
        name = Path(p).relative_to(rel).as_posix()
        if not fnmatch.fnmatch(name, only):
            continue
        old = (root / p).read_bytes()
        new, dropped = _without_event(old, event, name.endswith(".xz"), p)
        if dropped:
            files.append({"path": name, "bytes": len(old), "sha256": hashlib.sha256(old).hexdigest(),
                          "dropped_lines": dropped, "kept_bytes": len(new),
                          "kept_sha256": hashlib.sha256(new).hexdigest()})
            rewritten[p] = new
    if not files:
        raise SystemExit(f"{folder}: no tracked file matching {only!r} has a {event!r} line")
    for p, new in rewritten.items():
        (root / p).write_bytes(new)
    record = _record(f'the "{event}" lines of these files, no longer in the tracked tree: {why}; the rest of each '
                     f"file is unchanged (kept_sha256), the whole original", root, rel, files)
    (folder / "retired.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def retire(folder: Path, why: str, keep: tuple[str, ...] = ("README.md",), only: str = "*") -> dict:
    """git rm the tracked files under `folder` matching `only` but `keep` (names relative to it); write
    folder/retired.json."""
    root, rel, tracked = _tracked(folder)
    names = {p: Path(p).relative_to(rel).as_posix() for p in tracked}
    gone = [p for p in tracked if names[p] not in (*keep, "retired.json") and fnmatch.fnmatch(names[p], only)]
    if not gone:
        raise SystemExit(f"{folder}: no tracked file to retire")
    files = [{"path": names[p], "bytes": (root / p).stat().st_size,
              "sha256": hashlib.sha256((root / p).read_bytes()).hexdigest()} for p in gone]
    record = _record(f"files of this folder no longer in the tracked tree: {why}", root, rel, files)
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
    p.add_argument("--drop-event", default=None, help="keep the files, rewritten without their JSON lines whose "
                   '"event" is this (with --only naming the JSON-lines files)')
    args = p.parse_args(argv)
    if args.drop_event:
        record = drop_event(args.folder, args.why, args.drop_event, args.only)
        saved = sum(f["bytes"] - f["kept_bytes"] for f in record["files"])
        print(f"dropped {args.drop_event!r} lines from {len(record['files'])} files of {args.folder} "
              f"({saved:,} bytes); listed in {args.folder / 'retired.json'}")
        return 0
    record = retire(args.folder, args.why, tuple(args.keep or ["README.md"]), args.only)
    total = sum(f["bytes"] for f in record["files"])
    print(f"retired {len(record['files'])} files ({total:,} bytes) of {args.folder}; listed in "
          f"{args.folder / 'retired.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
