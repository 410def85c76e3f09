"""Gzip a results folder's bulky per-record JSON/JSONL before it is committed.

    python -m scalelab.core.recordgz RUN_FOLDER [--min-kib 64] [--dry-run]

Every .json/.jsonl below the given folders (or the given files) of at least --min-kib becomes `<name>.gz`, written
deterministically (no name, mtime 0) so the same content gives the same bytes; a file git tracks is `git mv`-ed
first, so the history shows a rename. Readers (scalelab.core.jsonio) take the plain name and find either, so
nothing else changes. Summaries stay plain and readable because they are small. Stdlib only.
"""
from __future__ import annotations

import argparse
import gzip
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scalelab.core.jsonio import GZ

SUFFIXES = (".json", ".jsonl")
DEFAULT_MIN_KIB = 64  # well under the 100 KB a tracked uncompressed record may reach (tests/test_tree_size.py)


@dataclass(frozen=True)
class Packed:
    source: Path
    dest: Path
    bytes_before: int
    bytes_after: int


def gzip_bytes(data: bytes) -> bytes:
    """Level-9 gzip with no file name and mtime 0: the same input always gives the same bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def candidates(paths: list[Path], min_bytes: int) -> list[Path]:
    """Plain .json/.jsonl files of at least min_bytes: the given files, and every one below the given folders."""
    out: set[Path] = set()
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or folder")
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        out |= {f for f in files if f.suffix in SUFFIXES and f.stat().st_size >= min_bytes}
    return sorted(out)


def _tracked(path: Path) -> bool:
    r = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent,
                       capture_output=True, text=True)
    return r.returncode == 0


def pack(path: Path) -> Packed:
    """path -> path.gz (git mv first when tracked; a stale path.gz is replaced: the plain file is the newer)."""
    data = path.read_bytes()
    dest = path.with_name(path.name + GZ)
    if _tracked(path) and not dest.exists():
        subprocess.run(["git", "mv", path.name, dest.name], cwd=path.parent, check=True)
    packed = gzip_bytes(data)
    dest.write_bytes(packed)
    if path.exists():
        if _tracked(path):
            subprocess.run(["git", "rm", "-q", "--cached", path.name], cwd=path.parent, check=True)
        path.unlink()
    if _tracked(dest):
        subprocess.run(["git", "add", dest.name], cwd=dest.parent, check=True)
    return Packed(path, dest, len(data), len(packed))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalelab.core.recordgz", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path, help="results folders (searched recursively) or files")
    ap.add_argument("--min-kib", type=float, default=DEFAULT_MIN_KIB,
                    help=f"compress files of at least this many KiB (default {DEFAULT_MIN_KIB})")
    ap.add_argument("--dry-run", action="store_true", help="list what would be compressed, change nothing")
    args = ap.parse_args(argv)
    try:
        todo = candidates(args.paths, int(args.min_kib * 1024))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    before = after = 0
    for f in todo:
        p = Packed(f, f.with_name(f.name + GZ), f.stat().st_size, 0) if args.dry_run else pack(f)
        before, after = before + p.bytes_before, after + p.bytes_after
        print(f"{p.source} -> {p.dest.name}: {p.bytes_before} -> {p.bytes_after or '?'} bytes")
    print(f"{len(todo)} file(s), {before} -> {after if not args.dry_run else '?'} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
