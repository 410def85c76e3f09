"""One run = one folder.

    <run>/config.toml        fully resolved config
    <run>/provenance.json    git sha, packages, hardware, data manifest hash, command
    <run>/predictions.json   written before the expensive part; its sha256 is logged as an event
    <run>/metrics.jsonl      append-only, one JSON object per event
    <run>/results.json       written at the end
    <run>/figures/*.png
    <run>/REPORT.md          regenerated from the files above alone
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Iterator

from scalelab.core import provenance
from scalelab.core.config import dump_toml
from scalelab.core.jsonio import append_jsonl, is_stored, iter_jsonl, read_bytes, read_json, write_json


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # files -----------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.toml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def figures(self) -> Path:
        d = self.path / "figures"
        d.mkdir(parents=True, exist_ok=True)
        return d

    # writing ---------------------------------------------------------------------------------
    def create(self, cfg: Any) -> "RunDir":
        self.path.mkdir(parents=True, exist_ok=True)
        dump_toml(cfg, self.config_path)
        return self

    def write_provenance(self, extra: dict | None = None) -> dict:
        prov = provenance.collect(extra)
        write_json(self.path / "provenance.json", prov)
        return prov

    def write_predictions(self, predictions: dict, event: str = "predictions_written") -> str:
        """Write predictions.json and log its hash as `event`: the record that they existed before the
        measurement. A `written_unix` in `predictions` (a file being extended) is kept, as is a `provenance`;
        otherwise the git sha and command of the folder's provenance.json go in, so the file names its origin."""
        payload = {"written_unix": time.time(), **predictions}
        payload.setdefault("provenance", provenance.folder_provenance(self.path))
        write_json(self.path / "predictions.json", payload)
        digest = hashlib.sha256((self.path / "predictions.json").read_bytes()).hexdigest()
        self.log_event(event, sha256=digest)
        return digest

    def log_event(self, event: str, **fields: Any) -> dict:
        record = {"event": event, "time_unix": time.time(), **fields}
        append_jsonl(self.metrics_path, record)
        return record

    def write_results(self, results: dict) -> None:
        write_json(self.path / "results.json", results)

    def write_report(self, markdown: str) -> Path:
        out = self.path / "REPORT.md"
        out.write_text(markdown)
        return out

    # reading ---------------------------------------------------------------------------------
    def read(self, name: str) -> Any:
        return read_json(self.path / name)

    def read_optional(self, name: str) -> Any:
        p = self.path / name
        return read_json(p) if is_stored(p) else None

    def events(self, kind: str | None = None) -> Iterator[dict]:
        for rec in iter_jsonl(self.metrics_path):
            if kind is None or rec.get("event") == kind:
                yield rec

    def predictions_sha256(self) -> str | None:
        p = self.path / "predictions.json"  # over the plain content, as logged, also once the file is gzipped
        return hashlib.sha256(read_bytes(p)).hexdigest() if is_stored(p) else None
