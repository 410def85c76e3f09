"""A committed battery task's generated texts dropped, its per-item verdicts kept:

    python -m scalelab.evals.itemdrop BATTERY_FOLDER TASK [TASK ...]

Every generated item keeps its question and completion so that a reader can look at an answer and a rescorer can
grade it again. An ablation's runs (a learning-rate sweep's MATH-500 check) need their verdicts, not their texts,
and the tracked tree that travels with every GPU call has a budget. What stays per item is everything the
battery's readers use (id, prompt hash, token count, finish reason, lenient and strict verdicts, the extracted
answer and the grader's reason); question and completion become empty strings. Nothing is written unless the
task's summary (tasks/<task>.json) is recomputed exactly from what stays. items/texts.json records each drop: the
row count and the sha256 of the file's plain content before, which finds it in the repository's history.
"""
from __future__ import annotations

import argparse
import hashlib
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from scalelab.core.jsonio import XZ, is_stored, read_bytes, read_json, write_json
from scalelab.evals.battery_records import (BatteryFolder, GenSummary, ItemRecord, read_items, summary_from_dict,
                                           write_jsonl_gz)

TEXTS_JSON = "texts.json"   # in items/, beside the files it speaks for


@dataclass(frozen=True)
class ItemsDropped:
    task: str
    rows: int
    texts: int       # items that had a completion before
    sha256: str      # of the items file's plain content before


def summary_mismatch(summary: GenSummary, items: list[ItemRecord]) -> list[str]:
    """The summary's per-item figures that `items` do not give back (empty when all agree)."""
    n = len(items)
    partials = [i.partial for i in items if i.partial is not None]
    again = {"n": n, "correct": sum(i.correct for i in items),
             "strict_correct": (sum(bool(i.strict) for i in items) if summary.strict_correct is not None else None),
             "partial_mean": sum(partials) / len(partials) if partials else None,
             "mean_completion_tokens": sum(i.completion_tokens for i in items) / n if n else 0.0,
             "length_share": sum(i.finish_reason == "length" for i in items) / n if n else 0.0}
    out = []
    for key, value in again.items():
        recorded = getattr(summary, key)
        same = (recorded == value if value is None or recorded is None or isinstance(value, int)
                else math.isclose(recorded, value, rel_tol=1e-12, abs_tol=1e-12))
        if not same:
            out.append(f"{key}: recorded {recorded}, items give {value}")
    return out


def drop_item_texts(folder: str | Path, task: str) -> ItemsDropped:
    bf = BatteryFolder(Path(folder))
    if not is_stored(bf.items(task)) or not is_stored(bf.summary(task)):
        raise FileNotFoundError(f"{bf.root}: needs items/{task}.jsonl and tasks/{task}.json (either may be packed)")
    summary = summary_from_dict(read_json(bf.summary(task)))
    if not isinstance(summary, GenSummary):
        raise ValueError(f"{bf.summary(task)}: a multiple-choice task has no generated texts to drop")
    items = read_items(bf, task)
    if not any(i.completion or i.question for i in items):
        raise ValueError(f"{bf.items(task)}: no texts to drop (dropped before? see items/{TEXTS_JSON})")
    slim = [replace(i, question="", completion="") for i in items]
    wrong = summary_mismatch(summary, slim)
    if wrong:
        raise ValueError(f"{bf.summary(task)}: the items do not give the recorded summary ({'; '.join(wrong)}); "
                         "nothing was dropped")
    before = read_bytes(bf.items(task))
    done = ItemsDropped(task, len(items), sum(bool(i.completion) for i in items), hashlib.sha256(before).hexdigest())
    write_jsonl_gz(bf.items(task), (asdict(i) for i in slim), XZ)   # the packed form committed results use
    log = bf.root / "items" / TEXTS_JSON
    earlier = read_json(log)["dropped"] if log.is_file() else []
    write_json(log, {"dropped": [*(d for d in earlier if d["task"] != task), asdict(done)],
                     "why": "verdicts kept, questions and completions dropped (scalelab.evals.itemdrop); sha256 is "
                            "of each items file's plain content before, which finds it in the repository's history"})
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="a battery folder (holding items/ and tasks/)")
    ap.add_argument("tasks", nargs="+")
    args = ap.parse_args(argv)
    for task in args.tasks:
        d = drop_item_texts(args.folder, task)
        print(f"{args.folder}: {task}: {d.texts} of {d.rows} texts dropped (before: sha256 {d.sha256[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
