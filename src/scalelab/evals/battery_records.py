"""The battery's records: one per item generated, one summary per task, the score rows a report prints, and the
files they live in (written atomically: a run cut off mid-write leaves the previous file or none).

    <out>/items/<task>.jsonl.gz     ItemRecord per generated item
    <out>/tasks/<task>.json         the task's summary (GenSummary or McSummary), with its settings and their hash
    <out>/lm_eval/<task>.json       lm-eval's result;  <task>_samples.jsonl.gz: its per-item log-likelihoods

The per-item files are written gzipped and may be committed as .xz (scalelab.core.recordgz --xz): BatteryFolder
names them by their plain names and they are read through core.jsonio, which finds either form.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from scalelab.core.jsonio import GZ, forms, is_stored, iter_jsonl, json_safe, read_json, write_json
from scalelab.core.recordgz import COMPRESS
from scalelab.evals.intervals import normal_interval, wilson_interval


@dataclass(frozen=True)
class ItemRecord:
    id: str
    prompt_sha256: str                 # of the chat messages sent, as JSON
    question: str                      # the last user turn
    completion: str
    completion_tokens: int             # the server's usage.completion_tokens
    finish_reason: str                 # "stop", or "length" at max_tokens
    correct: bool                      # the task's score().correct (GSM8K: the lenient reading)
    extracted: str | None
    reason: str
    strict: bool | None = None         # the asked-for form only (gsm8k); None where not scored
    partial: float | None = None       # share of sub-checks met, for tasks that have several


@dataclass(frozen=True)
class ScoreRow:
    """One number of the battery's table."""
    task: str
    metric: str                        # "lenient", "strict", "pass@1", "acc", "acc_norm", "mc2"
    n: int
    value: float
    ci_low: float
    ci_high: float
    ci_method: str                     # "wilson" or "normal" (mean ± 1.96·stderr)
    stderr: float | None = None        # lm-eval's, for the multiple-choice tasks
    note: str = ""


@dataclass(frozen=True)
class GenSummary:
    task: str
    split: str
    n: int
    correct: int
    strict_correct: int | None         # gsm8k only
    partial_mean: float | None         # tasks with sub-checks (ifeval_lite, toolcall_args)
    mean_completion_tokens: float
    length_share: float                # share of items whose finish_reason is "length"
    max_tokens: int
    wall_s: float
    tokens_per_s: float                # completion tokens of the task over its wall seconds
    settings: dict[str, Any]
    settings_sha256: str
    kind: str = "generate"
    sandbox: dict | None = None        # the layers code ran under (code tasks)

    def rows(self) -> list[ScoreRow]:
        note = (f"mean {self.mean_completion_tokens:.0f} tokens; {100 * self.length_share:.1f}% hit max_tokens "
                f"{self.max_tokens}; {self.tokens_per_s:,.0f} tok/s")
        if self.partial_mean is not None:
            note += f"; mean share of checks met {100 * self.partial_mean:.1f}%"
        head = "lenient" if self.strict_correct is not None else "pass@1"
        rows = [_share_row(self.task, head, self.correct, self.n, note)]
        if self.strict_correct is not None:
            rows.append(_share_row(self.task, "strict", self.strict_correct, self.n, "the \\boxed{} answer only"))
        return rows


@dataclass(frozen=True)
class McMetric:
    name: str
    value: float
    stderr: float | None


@dataclass(frozen=True)
class McSummary:
    task: str
    n: int
    num_fewshot: int
    metrics: tuple[McMetric, ...]
    wall_s: float
    lm_eval_version: str
    settings: dict[str, Any]
    settings_sha256: str
    kind: str = "mc"
    mean_of_probabilities: bool = False   # truthfulqa_mc2: its "acc" is a mean probability, not a share right

    def rows(self) -> list[ScoreRow]:
        return [self._row(m) for m in self.metrics]

    def _row(self, m: McMetric) -> ScoreRow:
        shots = f"{self.num_fewshot}-shot"
        stderr = "" if m.stderr is None else f"; lm-eval stderr {100 * m.stderr:.2f} pts"
        if self.mean_of_probabilities:
            lo, hi = normal_interval(m.value, m.stderr or 0.0)
            return ScoreRow(self.task, "mc2", self.n, m.value, lo, hi, "normal", m.stderr,
                            f"{shots}; a mean probability: CI = mean ± 1.96·stderr{stderr}")
        lo, hi = wilson_interval(m.value, self.n)
        return ScoreRow(self.task, m.name, self.n, m.value, lo, hi, "wilson", m.stderr, shots + stderr)


def _share_row(task: str, metric: str, k: int, n: int, note: str) -> ScoreRow:
    lo, hi = wilson_interval(k / n, n) if n else (0.0, 0.0)
    return ScoreRow(task, metric, n, k / n if n else 0.0, lo, hi, "wilson", None, note)


Summary = GenSummary | McSummary


def summary_from_dict(d: dict[str, Any]) -> Summary:
    d = {k: v for k, v in d.items() if k != "provenance"}  # the file's, not the summary's (write_summary)
    if d.get("kind") == "mc":
        return McSummary(**{**d, "metrics": tuple(McMetric(**m) for m in d["metrics"])})
    return GenSummary(**d)


# ---------------------------------------------------------------------------------------------
# files


@dataclass(frozen=True)
class BatteryFolder:
    root: Path

    def items(self, task: str) -> Path:
        """The plain name: stored as .gz when written, .xz once committed (module docstring)."""
        return self.root / "items" / f"{task}.jsonl"

    def summary(self, task: str) -> Path:
        return self.root / "tasks" / f"{task}.json"

    def lm_eval(self, task: str) -> Path:
        return self.root / "lm_eval" / f"{task}.json"

    def lm_eval_samples(self, task: str) -> Path:
        return self.root / "lm_eval" / f"{task}_samples.jsonl"

    @property
    def battery_json(self) -> Path:
        return self.root / "battery.json"

    @property
    def report_md(self) -> Path:
        return self.root / "REPORT.md"


def write_jsonl_gz(path: Path, records: Iterable[dict], form: str = GZ) -> Path:
    """`path` (a plain name) as `path.gz` (or `path.xz` with form XZ): deterministic compression (core.recordgz),
    written to a temporary name and renamed into place. Any other form of it (a committed `path.xz`, a plain copy)
    is removed: the new records supersede it, and readers would prefer a plain copy or refuse a .gz beside a .xz."""
    text = "".join(json.dumps(json_safe(r)) + "\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    dest = path.with_name(path.name + form)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_bytes(COMPRESS[form](text.encode()))
    os.replace(tmp, dest)
    for other in forms(path):
        if other != dest:
            other.unlink(missing_ok=True)
    return dest


def write_items(folder: BatteryFolder, task: str, items: list[ItemRecord]) -> Path:
    return write_jsonl_gz(folder.items(task), (asdict(i) for i in items))


def read_items(folder: BatteryFolder, task: str) -> list[ItemRecord]:
    return [ItemRecord(**r) for r in iter_jsonl(folder.items(task))]


def write_summary(folder: BatteryFolder, summary: Summary, provenance: dict[str, Any]) -> Path:
    """The task's summary with what made it (git sha, command): a resumed battery's tasks may come from
    different invocations, so battery.json's provenance does not speak for each of them."""
    write_json(folder.summary(summary.task), {**asdict(summary), "provenance": provenance})
    return folder.summary(summary.task)


def stored_summary(folder: BatteryFolder, task: str, sha: str) -> Summary | None:
    """The task's summary when it was made with these settings (and its per-item file is there); else None."""
    path = folder.summary(task)
    if not path.is_file():
        return None
    summary = summary_from_dict(read_json(path))
    items = folder.items(task) if summary.kind == "generate" else folder.lm_eval_samples(task)
    return summary if summary.settings_sha256 == sha and is_stored(items) else None


def all_summaries(folder: BatteryFolder) -> list[Summary]:
    return [summary_from_dict(read_json(p)) for p in sorted((folder.root / "tasks").glob("*.json"))]
