"""Compress a results folder's bulky per-record JSON/JSONL before it is committed.

    python -m scalelab.core.recordgz RUN_FOLDER [--xz] [--min-kib 64] [--dry-run]
    python -m scalelab.core.recordgz STUDY_FOLDER --dedup [--min-kib 64] [--dry-run]

Every .json/.jsonl below the given folders (or the given files) of at least --min-kib becomes `<name>.gz`, or with
--xz `<name>.xz` (a quarter to a third smaller; --xz also converts every `<name>.gz` there, whatever its size, since
it was already judged bulky). Both are written deterministically (gzip: no name, mtime 0; xz has no timestamp) so
the same content gives the same bytes; a file git tracks is `git mv`-ed and the new name staged, so the index (what
tests/test_tree_size.py measures) follows (git still shows a delete and an add: it pairs renames by content, and the
two forms share none), and any other stored form of the same record is removed (it is the older one). Readers (scalelab.core.jsonio) take the
plain name and find any form, so nothing else changes. Summaries stay plain and readable because they are small.

gzip stays the default: it is what runs write (evals.battery_records) and packs in a fraction of the time and
memory xz -9e takes (~0.7 GB per file); --xz is the step before a commit, where every byte travels with each call
to a GPU machine. Stdlib only.

--dedup finds records of one file name below the given folders whose content repeats an earlier one's (e.g. the
base model's evaluation, which every run of a study stores, equal but for its wall-clock time) and replaces each
repeat with a `<name>.same` pointer to the first by path, with the differing top-level fields as a patch
(scalelab.core.jsonio reads it back byte for byte and checks its sha256), staged in git as packing is.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scalelab.core.jsonio import (GZ, SAME, XZ, find_stored, forms, json_text, logical, pointer_content, read_bytes,
                                  stored)

SUFFIXES = (".json", ".jsonl")
DEFAULT_MIN_KIB = 64  # well under the 100 KB a tracked uncompressed record may reach (tests/test_tree_size.py)
XZ_PRESET = 9 | lzma.PRESET_EXTREME


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


def xz_bytes(data: bytes) -> bytes:
    """xz at preset 9e: the format carries no name or time, so the same input and preset give the same bytes
    (with the same liblzma; its encoder is not promised to stay byte-stable across releases)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, preset=XZ_PRESET)


COMPRESS = {GZ: gzip_bytes, XZ: xz_bytes}


def _gz_record(f: Path) -> bool:
    return f.suffix == GZ and logical(f).suffix in SUFFIXES


def candidates(paths: list[Path], min_bytes: int, form: str = GZ) -> list[Path]:
    """The files to pack into `form`: plain .json/.jsonl of at least min_bytes, and for xz also every .json.gz /
    .jsonl.gz whose plain file is absent (a plain file wins: its .gz is stale), among the given files and below
    the given folders."""
    out: set[Path] = set()
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or folder")
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        out |= {f for f in files if f.suffix in SUFFIXES and f.stat().st_size >= min_bytes}
        if form == XZ:
            out |= {f for f in files if _gz_record(f) and not logical(f).is_file()}
    return sorted(out)


def _tracked(path: Path) -> bool:
    r = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent,
                       capture_output=True, text=True)
    return r.returncode == 0


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=path.parent, check=True)


def _drop(path: Path) -> None:
    """Remove a superseded form of a record, from the index too when git tracks it."""
    if _tracked(path):
        _git(path, "rm", "-q", "--cached", path.name)
    path.unlink()


def pack(path: Path, form: str = GZ) -> Packed:
    """path (plain, or .gz when form is .xz) -> <plain name><form>: git mv first when tracked, then the new bytes;
    every other form of the record left is removed (the source is the newest: module docstring)."""
    data = read_bytes(path)
    before = path.stat().st_size
    dest = logical(path).with_name(logical(path).name + form)
    was_tracked = _tracked(path)
    if was_tracked and not dest.exists():
        _git(path, "mv", path.name, dest.name)
    packed = COMPRESS[form](data)
    dest.write_bytes(packed)
    for other in forms(path):
        if other != dest and other.exists():
            _drop(other)
    if was_tracked or _tracked(dest):
        _git(dest, "add", dest.name)
    return Packed(path, dest, before, len(packed))


MAX_PATCH_FIELDS = 3  # a record that differs from another in more top-level fields than this is not a repeat


def patch_between(kept: bytes, copy: bytes) -> dict | None:
    """{} when the contents are equal; the top-level fields to replace in `kept`'s JSON object to get exactly
    `copy`'s bytes (as write_json writes them) when at most MAX_PATCH_FIELDS differ; else None."""
    if kept == copy:
        return {}
    try:
        a, b = json.loads(kept), json.loads(copy)
    except ValueError:
        return None
    if not isinstance(a, dict) or not isinstance(b, dict) or list(a) != list(b):
        return None
    patch = {k: b[k] for k in b if a[k] != b[k]}
    if len(patch) > MAX_PATCH_FIELDS or json_text({**a, **patch}).encode() != copy:
        return None
    return patch


def duplicates(paths: list[Path], min_bytes: int) -> list[tuple[Path, Path, dict]]:
    """(copy, kept, patch): records below `paths` of the same file name whose stored file is at least min_bytes and
    whose content repeats an earlier one's (by path) exactly or up to a patch (patch_between). Pointers already
    there are neither copies nor kept."""
    by_name: dict[str, list[Path]] = {}
    for root in paths:
        for plain in find_stored(root, "*.json*") if root.is_dir() else [logical(root)]:
            found = stored(plain)
            if found is not None and found.suffix != SAME and found.stat().st_size >= min_bytes:
                by_name.setdefault(plain.name, []).append(plain)
    out = []
    for group in by_name.values():
        kept: list[tuple[Path, bytes]] = []
        for plain in sorted(set(group)):
            data = read_bytes(plain)
            match = next(((k, p) for k, kd in kept if (p := patch_between(kd, data)) is not None), None)
            if match is None:
                kept.append((plain, data))
            else:
                out.append((plain, match[0], match[1]))
    return out


def point(copy: Path, kept: Path, patch: dict) -> Path:
    """Replace every stored form of `copy` by `<copy>.same` naming `kept` (relative), the patch and the sha256 of
    copy's content, after checking that the pointer reads back as exactly that content."""
    data = read_bytes(copy)
    pointer = copy.with_name(copy.name + SAME)
    ref = {"same_as": os.path.relpath(kept, copy.parent), "sha256": hashlib.sha256(data).hexdigest(),
           **({"patch": patch} if patch else {})}
    if pointer_content(pointer, ref) != data:
        raise ValueError(f"{copy}: its pointer to {kept} does not read back as its content")
    tracked = any(f.exists() and _tracked(f) for f in forms(copy))
    for other in forms(copy):
        if other != pointer and other.exists():
            _drop(other)
    pointer.write_text(json.dumps(ref, indent=1) + "\n")
    if tracked:
        _git(pointer, "add", pointer.name)
    return pointer


def dedup_main(paths: list[Path], min_bytes: int, dry_run: bool) -> int:
    saved = 0
    for copy, kept, patch in duplicates(paths, min_bytes):
        saved += stored(copy).stat().st_size
        print(f"{copy} -> {copy.name}{SAME} (as {kept}{', patched: ' + ', '.join(patch) if patch else ''})")
        if not dry_run:
            point(copy, kept, patch)
    print(f"{saved} bytes {'would be ' if dry_run else ''}saved")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalelab.core.recordgz", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path, help="results folders (searched recursively) or files")
    ap.add_argument("--xz", action="store_true", help="pack to <name>.xz (xz -9e), converting <name>.gz files too")
    ap.add_argument("--min-kib", type=float, default=DEFAULT_MIN_KIB,
                    help=f"compress plain files of at least this many KiB (default {DEFAULT_MIN_KIB})")
    ap.add_argument("--dry-run", action="store_true", help="list what would be compressed, change nothing")
    ap.add_argument("--dedup", action="store_true",
                    help="replace a record that repeats an earlier one of its name (equal, or up to a few "
                         "top-level fields) by a <name>.same pointer to it")
    args = ap.parse_args(argv)
    if args.dedup:
        return dedup_main(args.paths, int(args.min_kib * 1024), args.dry_run)
    form = XZ if args.xz else GZ
    try:
        todo = candidates(args.paths, int(args.min_kib * 1024), form)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    before = after = 0
    for f in todo:
        dest = logical(f).with_name(logical(f).name + form)
        p = Packed(f, dest, f.stat().st_size, 0) if args.dry_run else pack(f, form)
        before, after = before + p.bytes_before, after + p.bytes_after
        print(f"{p.source} -> {p.dest.name}: {p.bytes_before} -> {p.bytes_after or '?'} bytes")
    print(f"{len(todo)} file(s), {before} -> {after if not args.dry_run else '?'} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
