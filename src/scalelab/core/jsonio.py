"""Atomic JSON writes and append-only JSONL: nothing already written is lost to a crash mid-write.

Readers are compression-transparent: a committed per-record file may be stored as `<name>.gz` or `<name>.xz`
(results folders are kept small enough to travel with every call to a GPU machine; xz packs them a quarter to a
third smaller than gzip), and `read_json`, `iter_jsonl`, `open_text`, `read_bytes` and `find_stored` take the plain
name and find any of them, in this order: the plain file, then `.gz`, then `.xz`. Writers write the plain file (or,
for the battery's per-item records, `.gz`); only scalelab.core.recordgz writes `.xz`.

When more than one form exists: the plain file wins (a run resumed or re-scored after its folder was compressed
writes it, so it is the newer). A `.gz` beside a `.xz` with no plain file is an error naming both: either may be
the newer (a run's `.gz` after a commit's `.xz`, or a `.gz` left behind by hand), and they could disagree.

A committed record that repeats another one (every run of a study scored the same base model) may be stored as
`<name>.same`, a small JSON pointer {"same_as": <the other record's plain name, relative to this folder>,
"sha256": <of this record's plain content>, "patch": <optional: top-level JSON fields that differ, e.g. a
wall-clock time>}. Readers take the other record's content, replace the patched fields (re-serialized as
write_json writes), and check the hash: the bytes read are this record's own, exactly, and a changed target is an
error naming both files, never a silent substitute. `recordgz --dedup` writes pointers only where that holds.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import math
import os
import zlib
from pathlib import Path
from typing import IO, Any, Iterator

GZ = ".gz"
XZ = ".xz"
SAME = ".same"
PACKED = (GZ, XZ, SAME)  # the stored forms after the plain one, in the order readers look for them


def json_safe(obj: Any) -> Any:
    # JSON has no NaN/inf: write them as strings so a diverged value is kept, not a parse error later.
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj: Any) -> str:
    """The text write_json writes for `obj`."""
    return json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json_text(obj))
    os.replace(tmp, path)


def logical(path: str | Path) -> Path:
    """The plain name a stored file stands for: `a/b.json.gz` and `a/b.json.xz` -> `a/b.json`."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(path.suffix)) if path.suffix in PACKED else path


def forms(path: str | Path) -> list[Path]:
    """Every name `path`'s content may be stored under, in the order readers look: plain, .gz, .xz, .same."""
    plain = logical(path)
    return [plain, *(plain.with_name(plain.name + s) for s in PACKED)]


class AmbiguousStored(ValueError):
    """Two compressed forms of one record and no plain file: which holds the content is not knowable here."""


def stored(path: str | Path) -> Path | None:
    """The file holding `path`'s content: `path` itself, else `path.gz`, else `path.xz`, else the pointer
    `path.same` (read_bytes follows it); None when none exists. A name that is already a stored form (`x.json.gz`)
    is that file only. Two of `.gz`, `.xz`, `.same` without the plain file is an AmbiguousStored error (module
    docstring)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.suffix in PACKED:
        return None
    present = [f for f in forms(path)[1:] if f.is_file()]
    if len(present) > 1:
        raise AmbiguousStored(f"{present[0]} and {present[1]} both hold this record and may disagree: delete the "
                              f"stale one (`python -m scalelab.core.recordgz --xz {present[0]}` repacks a .gz "
                              "over the .xz)")
    return present[0] if present else None


def same_content(pointer: Path) -> bytes:
    """The plain content a `.same` pointer stands for: its target's, patched, checked against its sha256."""
    try:
        ref = json.loads(pointer.read_text())
    except ValueError as e:
        raise ValueError(f"{pointer}: not a record pointer {{same_as, sha256[, patch]}}: {e}") from None
    return pointer_content(pointer, ref)


def pointer_content(pointer: Path, ref: Any) -> bytes:
    """What a pointer at `pointer` holding `ref` (its parsed JSON) reads as; recordgz checks a pointer with it
    before writing one."""
    try:
        target, digest, patch = pointer.parent / ref["same_as"], ref["sha256"], ref.get("patch", {})
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{pointer}: not a record pointer {{same_as, sha256[, patch]}}: {e}") from None
    found = stored(target)
    if found is None or found.suffix == SAME:
        raise FileNotFoundError(f"{pointer}: points to {target}, which holds no record of its own (not found, or "
                                "itself a pointer)")
    data = _content(found)
    if patch:
        data = json_text({**json.loads(data), **patch}).encode()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"{pointer}: {found} no longer has the content it pointed to (sha256 differs); restore "
                         "that record or store this one in full")
    return data


def is_stored(path: str | Path) -> bool:
    return stored(path) is not None


def find_stored(root: str | Path, pattern: str) -> list[Path]:
    """Files below `root` matching `pattern`, plain or compressed, by their plain names (sorted, each once)."""
    root = Path(root)
    found = {logical(p) for suffix in ("", *PACKED) for p in root.rglob(pattern + suffix)}
    return sorted(p for p in found if is_stored(p))


def _missing(path: Path) -> FileNotFoundError:
    also = "" if path.suffix in PACKED else f" (nor {path.name}{GZ} nor {path.name}{XZ} nor {path.name}{SAME})"
    return FileNotFoundError(f"{path}: not found{also}")


def open_text(path: str | Path) -> IO[str]:
    """`path` (or `path.gz`, or `path.xz`) opened for reading UTF-8 text, for a reader that streams."""
    found = stored(path)
    if found is None:
        raise _missing(Path(path))
    if found.suffix == SAME:
        return io.StringIO(same_content(found).decode("utf-8"))
    if found.suffix == GZ:
        return gzip.open(found, "rt", encoding="utf-8")
    if found.suffix == XZ:
        return lzma.open(found, "rt", encoding="utf-8")
    return open(found, encoding="utf-8")


def read_bytes(path: str | Path) -> bytes:
    """The content of `path` (or `path.gz`, or `path.xz`, decompressed, or the record `path.same` points to): what
    a hash of the plain file was taken over."""
    found = stored(path)
    if found is None:
        raise _missing(Path(path))
    return _content(found)


def _content(found: Path) -> bytes:
    """The plain content of one stored file (plain, .gz, .xz or a .same pointer)."""
    if found.suffix == SAME:
        return same_content(found)
    data = found.read_bytes()
    if found.suffix == GZ:
        return _gunzip(found, data)
    if found.suffix == XZ:
        return _unxz(found, data)
    return data


def _gunzip(found: Path, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError; a cut file is an EOFError
        raise ValueError(f"{found}: damaged gzip file: {e or 'truncated'}") from None


def _unxz(found: Path, data: bytes) -> bytes:
    try:
        return lzma.decompress(data, format=lzma.FORMAT_XZ)
    except (lzma.LZMAError, EOFError) as e:  # a cut file: "Compressed data ended before the end-of-stream marker"
        raise ValueError(f"{found}: damaged xz file: {e or 'truncated'}") from None


def read_text(path: str | Path) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{stored(path)}: invalid JSON at line {e.lineno}: {e.msg}") from None


def append_jsonl(path: str | Path, obj: Any) -> None:
    """One line per event, flushed and fsynced: a killed process keeps every finished line."""
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(obj)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Every complete line of `path` (or `path.gz`, or `path.xz`; none: nothing); a torn last line (a crash
    mid-write) is skipped, any other bad line is an error."""
    found = stored(path)
    if found is None:
        return
    lines = read_text(found).splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                return
            raise ValueError(f"{found}:{i}: invalid JSON line: {e.msg}") from None


def read_jsonl(path: str | Path) -> list[dict]:
    """iter_jsonl's records as a list; a missing file is an error here (iter_jsonl reads it as empty)."""
    if not is_stored(path):
        raise _missing(Path(path))
    return list(iter_jsonl(path))
