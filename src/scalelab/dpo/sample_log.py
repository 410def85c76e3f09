"""The verifier set's raw samples, one line appended per finished batch: a build cut short (a time window ending,
a kill) resumes with the batches it has and samples only the ones it lacks.

The side file (verifier_pairs.samples_path: <stem>.samples.jsonl beside the set) holds one line per batch:

    {"start": 256, "seed": 25856, "key": "<sha256 prefix of the set's manifest key>",
     "prompts": [{"id": "<example id>", "samples": [{"text": "...", "n_tokens": 212}, ... k of them]}, ...]}

in completion order (with concurrent requests a later batch may finish first). Each line is written, flushed and
fsynced at once (core.jsonio.append_jsonl), so a kill loses only the batches in flight. Seeds are per batch
(dpo.samplers.batch_seed), so a batch sampled on resume gets the seed an uninterrupted build gives it.

Reading it back: a last line without its newline was cut mid-write; it is cut off the file (so the next append
starts a clean line) and its batch is sampled again. Any other unreadable line, a line recorded under another key
(other settings: a set mixed from two would be described by no config) or for other prompts is an error naming
the file and line. Such a file is neither mixed in nor thrown away: it may hold hours of sampling, and the usual
cause is a resume that forgot an override.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from scalelab.core.errors import DataError
from scalelab.core.jsonio import append_jsonl
from scalelab.dpo.config import VerifierConfig
from scalelab.dpo.samplers import OnBatch, Sample, Sampler, batch_seed, batch_starts, run_batches

Batches = dict[int, list[list[Sample]]]   # a batch's first prompt index -> its prompts' samples


class SampleLogError(DataError, ValueError):
    """A side file that cannot be resumed from: damaged, or sampled under other settings or for other prompts."""


def key_hash(key: dict) -> str:
    """A short digest of a manifest key (verifier_pairs.manifest_key): what every line must carry."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def complete_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every finished line; a torn tail (no newline: cut mid-write) is cut off the file."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())
    return [(i, line) for i, line in enumerate(data[:end].decode("utf-8").splitlines(), 1) if line.strip()]


@dataclass(frozen=True)
class SampleLog:
    path: Path
    key: str                      # key_hash of the set's manifest key

    def first_key(self) -> str | None:
        """The key of the first line; None when there is no readable one."""
        lines = complete_lines(self.path) if self.path.is_file() else []
        try:
            return json.loads(lines[0][1]).get("key") if lines else None
        except (json.JSONDecodeError, AttributeError):
            return None

    def append(self, start: int, ids: Sequence[str], samples: list[list[Sample]], cfg: VerifierConfig) -> None:
        prompts = [{"id": i, "samples": [{"text": s.text, "n_tokens": s.n_tokens} for s in group]}
                   for i, group in zip(ids, samples)]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, {"start": start, "seed": batch_seed(cfg, start), "key": self.key, "prompts": prompts})

    def load(self, ids: Sequence[str], cfg: VerifierConfig) -> Batches:
        """The batches already sampled for these prompts (by example id, in build order); the first line of a
        batch wins should one appear twice."""
        out: Batches = {}
        for n, line in complete_lines(self.path) if self.path.is_file() else []:
            where = f"{self.path}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SampleLogError(f"{where}: invalid JSON line ({e.msg}) before the last line: the file is damaged; "
                                 "move it away to sample every batch again") from None
            start, samples = self._batch(rec, where, ids, cfg)
            out.setdefault(start, samples)
        return out

    def _batch(self, rec: Any, where: str, ids: Sequence[str], cfg: VerifierConfig) -> tuple[int, list[list[Sample]]]:
        if not isinstance(rec, dict) or rec.get("key") != self.key:
            got = rec.get("key") if isinstance(rec, dict) else None
            raise SampleLogError(f"{where}: sampled under other settings (key {got!r}, this build's {self.key!r}); not "
                             "mixed into this set: rerun with the settings it was sampled under to resume it, or "
                             "move the file away to sample anew")
        try:
            start, prompts = rec["start"], rec["prompts"]
            samples = [[Sample(s["text"], int(s["n_tokens"])) for s in p["samples"]] for p in prompts]
            same = (start in batch_starts(len(ids), cfg) and rec["seed"] == batch_seed(cfg, start)
                    and [p["id"] for p in prompts] == list(ids[start:start + cfg.batch_prompts])
                    and all(len(g) == cfg.samples_per_prompt for g in samples))
        except (KeyError, TypeError, ValueError) as e:
            raise SampleLogError(f"{where}: not a batch record ({type(e).__name__}: {e})") from None
        if not same:
            raise SampleLogError(f"{where}: batch {start} is not this build's (its seed, example ids or sample count "
                             "differ: has the task's data changed?); move the file away to sample anew")
        return start, samples


def sample_logged(sampler: Sampler, examples: Sequence[Any], cfg: VerifierConfig, log: SampleLog | None = None,
                  on_batch: OnBatch | None = None) -> tuple[list[list[Sample]], int, int]:
    """Every example's k samples in order, the batches `log` holds loaded, the others sampled (dpo.samplers.
    run_batches) and each appended to it as it finishes; also how many batches were loaded and sampled."""
    ids = [str(ex.id) for ex in examples]
    got = log.load(ids, cfg) if log else {}
    loaded, total = len(got), len(examples)
    if got and on_batch:
        on_batch(sum(map(len, got.values())), total)
    todo = [b for b in batch_starts(total, cfg) if b not in got]

    def done(start: int, samples: list[list[Sample]]) -> None:
        if log:
            log.append(start, ids[start:start + len(samples)], samples, cfg)
        got[start] = samples
        if on_batch:
            on_batch(sum(map(len, got.values())), total)
    run_batches(sampler, [ex.prompt for ex in examples], cfg, todo, done)
    return [group for b in sorted(got) for group in got[b]], loaded, len(todo)
