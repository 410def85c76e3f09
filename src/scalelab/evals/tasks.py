"""Verifiable tasks: the uniform records, the registry, and where task data comes from.

Every task turns its data into `Example`s (chat-format prompt, gold answer, metadata) and scores a
completion against one into a `Score`. The DPO job builds preference pairs from scored samples, the GRPO job
turns scores into rewards (rewards.py): both see only this interface.

Data: `source` is a local path (file or folder) or a Hugging Face hub id, interchangeably. Left empty it is
the task's folder in ../shared/data (beside the project; override with $SCALELAB_SHARED_DATA) when that
exists, else the hub id. Tasks generated procedurally ignore `source`.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from scalelab.core import errors

Message = dict[str, str]  # {"role": "user", "content": "..."}


class DataError(errors.DataError, ValueError):
    """Task data is missing or malformed; the message names the file and line (or the hub id)."""


@dataclass(frozen=True)
class Example:
    task: str  # registry name of the task that scores it
    id: str  # stable across runs: the data set's own id, or the generator's seed and index
    prompt: list[Message]
    answer: str  # the gold answer as text ("18", "\\frac{1}{2}", a reference solution, a JSON call)
    meta: dict[str, Any] = field(default_factory=dict)  # what the scorer needs besides the answer


@dataclass(frozen=True)
class Score:
    correct: bool
    extracted: str | None  # what was read from the completion (None: nothing usable)
    reason: str  # one line a human can check: "wrong: got 17, expected 18 (marker ####)"
    partial: float | None = None  # share of sub-checks passed, for tasks that have several; else None


class Task(Protocol):
    name: str
    splits: tuple[str, ...]

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        """`limit` examples of `split` (all, or the generator's default size, when None). `seed` drives
        procedural tasks; file-backed tasks keep file order, so limit=N is always the first N rows."""
        ...

    def score(self, example: Example, completion: str) -> Score: ...

    def check_format(self, example: Example, completion: str) -> bool: ...


# ---------------------------------------------------------------------------------------------
# registry

_REGISTRY: dict[str, Callable[..., Task]] = {}
# Modules whose import registers the built-in tasks; loaded on first lookup so that importing this module
# stays cheap and free of cycles.
BUILTIN_MODULES = ("scalelab.evals.mathtasks", "scalelab.evals.codetasks", "scalelab.evals.arithmetic",
                   "scalelab.evals.toolcall", "scalelab.evals.ifeval")


def register_task(name: str) -> Callable:
    def add(factory: Callable[..., Task]) -> Callable[..., Task]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"task {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory
    return add


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def task_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_task(name: str, **options: Any) -> Task:
    """The task registered as `name`, built with `options` (e.g. prompt_format="answer_only")."""
    _load_builtins()
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**options)


_DEFAULTS: dict[str, Task] = {}


def default_task(name: str) -> Task:
    """The task `name` with default options, built once (scoring needs no options: see score_example)."""
    if name not in _DEFAULTS:
        _DEFAULTS[name] = get_task(name)
    return _DEFAULTS[name]


def score_example(example: Example, completion: str) -> Score:
    """Score with the task named in the example: everything scoring needs is in the example itself
    (prompt format, tests, constraints), so the task's own options never change a score."""
    return default_task(example.task).score(example, completion)


def check_split(task: str, split: str, splits: tuple[str, ...]) -> None:
    if split not in splits:
        raise DataError(f"task {task!r} has no split {split!r}; its splits: {', '.join(splits)}")


def chat(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------------------------------------
# held-out splits for data without them


def in_holdout(key: str, share: float = 0.1, salt: str = "scalelab-holdout") -> bool:
    """Whether `key` (e.g. a generated question) belongs to the held-out split. A hash of the content,
    not of the seed: train and test stay disjoint however many examples or seeds are drawn."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


# ---------------------------------------------------------------------------------------------
# sources: local files or the hub


def shared_data_root() -> Path:
    env = os.environ.get("SCALELAB_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3].parent / "shared" / "data"


@dataclass(frozen=True)
class Resolved:
    kind: str  # "local" | "hub"
    where: str  # a path, or a hub id


def resolve_source(source: str, local_name: str, hub_id: str) -> Resolved:
    """A path when `source` (or, if empty, the shared-data folder `local_name`) exists; else a hub id."""
    if not source:
        local = shared_data_root() / local_name
        return Resolved("local", str(local)) if local.exists() else Resolved("hub", hub_id)
    if Path(source).exists():
        return Resolved("local", source)
    looks_like_path = source.startswith((".", "/", "~")) or source.endswith((".json", ".jsonl", ".gz"))
    if looks_like_path or source.count("/") != 1:
        raise DataError(f"{source}: no such file or folder (and not a hub id of the form owner/name)")
    return Resolved("hub", source)


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .jsonl.gz (one object per line) or .json (a list of objects) file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.name.endswith(".json"):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataError(f"{path}: expected a JSON list of objects")
        return rows
    rows = []
    with _open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: invalid JSON at line {n}: {e.msg}") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {n} is a JSON {type(row).__name__}, not an object")
            rows.append(row)
    return rows


def require_fields(row: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    missing = [f for f in fields if f not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")


def hub_records(hub_id: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """One split of a hub dataset as plain rows (needs the `datasets` package: pip install scalelab[hub])."""
    try:
        import datasets  # lazy: datasets is optional (the hub extra; trl brings it)
    except ImportError:
        raise DataError(f"{hub_id}: loading from the hub needs the 'datasets' package "
                        "(pip install 'scalelab[hub]'), or pass a local path as source") from None
    try:
        data = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:  # the hub client raises many types (network, auth, missing config)
        raise DataError(f"{hub_id} (config {config!r}, split {split!r}): could not load: {e}") from e
    return [dict(row) for row in data]


def take(rows: list, limit: int | None) -> list:
    """The first `limit` rows (all when None): file order is kept so runs with one limit compare."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return rows if limit is None else rows[:limit]
