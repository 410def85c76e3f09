"""Atomic JSON writes and append-only JSONL: nothing already written is lost to a crash mid-write.

Readers are gzip-transparent: a committed per-record file may be stored as `<name>.gz` (results folders are kept
small enough to travel with every call to a GPU machine), and `read_json`, `iter_jsonl`, `open_text` and
`find_stored` take the plain name and find either. Writers always write the plain file; when both exist the plain
one is newer (a run resumed or re-scored after its folder was compressed) and wins.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import IO, Any, Iterator

GZ = ".gz"


def json_safe(obj: Any) -> Any:
    # JSON has no NaN/inf: write them as strings so a diverged value is kept, not a parse error later.
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str | Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def logical(path: str | Path) -> Path:
    """The plain name a stored file stands for: `a/b.json.gz` -> `a/b.json`."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(GZ))


def stored(path: str | Path) -> Path | None:
    """The file holding `path`'s content: `path` itself, else `path.gz`; None when neither exists."""
    path = Path(path)
    if path.is_file():
        return path
    packed = path.with_name(path.name + GZ)
    return packed if path.suffix != GZ and packed.is_file() else None


def is_stored(path: str | Path) -> bool:
    return stored(path) is not None


def find_stored(root: str | Path, pattern: str) -> list[Path]:
    """Files below `root` matching `pattern`, plain or gzipped, by their plain names (sorted, each once)."""
    root = Path(root)
    found = {logical(p) for p in root.rglob(pattern)} | {logical(p) for p in root.rglob(pattern + GZ)}
    return sorted(p for p in found if is_stored(p))


def _missing(path: Path) -> FileNotFoundError:
    also = "" if path.suffix == GZ else f" (nor {path.name}{GZ})"
    return FileNotFoundError(f"{path}: not found{also}")


def open_text(path: str | Path) -> IO[str]:
    """`path` (or `path.gz`) opened for reading UTF-8 text, for a reader that streams."""
    found = stored(path)
    if found is None:
        raise _missing(Path(path))
    if found.suffix == GZ:
        return gzip.open(found, "rt", encoding="utf-8")
    return open(found, encoding="utf-8")


def read_bytes(path: str | Path) -> bytes:
    """The content of `path` (or `path.gz`, decompressed): what a hash of the plain file was taken over."""
    found = stored(path)
    if found is None:
        raise _missing(Path(path))
    data = found.read_bytes()
    if found.suffix != GZ:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError; a cut file is an EOFError
        raise ValueError(f"{found}: damaged gzip file: {e or 'truncated'}") from None


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
    """Every complete line of `path` (or `path.gz`; neither: nothing); a torn last line (a crash mid-write) is
    skipped, any other bad line is an error."""
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
