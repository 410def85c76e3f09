"""Atomic JSON writes and append-only JSONL: nothing already written is lost to a crash mid-write."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator


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


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None


def append_jsonl(path: str | Path, obj: Any) -> None:
    """One line per event, flushed and fsynced: a killed process keeps every finished line."""
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(obj)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Every complete line; a torn last line (a crash mid-write) is skipped, any other bad line is an error."""
    path = Path(path)
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                return
            raise ValueError(f"{path}:{i}: invalid JSON line: {e.msg}") from None
