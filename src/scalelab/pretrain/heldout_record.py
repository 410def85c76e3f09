"""<run>/heldout.json: a run's scores on held-out token sets by name (heldout.py computes them). Apart from the
scoring, and free of torch, so the drivers that only read the record (bench/gpu_pretrain_ttt_real.py) stay quick."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from scalelab.core import errors
from scalelab.core.jsonio import write_json

RECORD_FILE = "heldout.json"


class HeldoutError(errors.DataError, ValueError):
    """A held-out set or run folder that cannot be scored or read: missing, not token shards, another vocabulary."""


@dataclass(frozen=True)
class HeldoutLoss:
    name: str          # its key in heldout.json, e.g. "wikitext2"
    path: str          # the shard file or folder scored
    sha256: str        # over the shards' bytes in order: the same tokens, wherever they were prepared
    loss: float        # mean cross-entropy per target token, nats
    tokens: int        # target tokens scored: windows * block_size
    windows: int
    block_size: int
    step: int          # the checkpoint's optimizer step


def read_records(run_dir: str | Path) -> dict[str, dict]:
    """heldout.json's {name: HeldoutLoss fields}; {} when the run has none."""
    path = Path(run_dir) / RECORD_FILE
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise HeldoutError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise HeldoutError(f"{path}: expected an object of held-out scores by name")
    return doc


def record(run_dir: str | Path, result: HeldoutLoss) -> Path:
    """Add (or replace) this set's score in <run>/heldout.json, atomically; other sets' scores are kept."""
    path = Path(run_dir) / RECORD_FILE
    write_json(path, {**read_records(run_dir), result.name: asdict(result)})
    return path


def format_heldout(result: HeldoutLoss) -> str:
    return (f"{result.name}: {result.loss:.4f} nats/token over {result.tokens:,} tokens "
            f"({result.windows} windows of {result.block_size}) at step {result.step} [{result.path}]")
