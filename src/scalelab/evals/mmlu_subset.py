"""A fixed stratified subset of MMLU test: the same items for every run, chosen by a hash of each item.

Full MMLU (14,042 questions, 5-shot) costs too much to run for every row of an ablation, so those rows use a
subset, and base vs tuned are compared on it, paired (McNemar 1947). For that the subset must be (1) the same
items for every run and every machine, so it is a function of the items' text alone: each subject keeps the
items with the smallest sha256 of (subject, question, choices), which depends on no seed, run order or file
order; and (2) stratified by subject, so its accuracy weighs the subjects as full MMLU does: subject s keeps
n * size_s / N items, rounded by the largest-remainder method (ties to the earlier subject name) so the quotas
add up to n exactly.

The subset is written as an MMLU folder (dev/ unchanged: the 5-shot exemplars; test/ with the kept rows in
file order), which the local lm-eval tasks read like the full one, plus subset.json naming each kept row's
index in the full file, so a full-MMLU record can be restricted to the subset and paired with a subset run.
"""
from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path
from typing import Mapping, Sequence

from scalelab.core.filelock import file_lock
from scalelab.evals.localdata import MMLU_HEADER, mmlu_files, read_mmlu_csv

SUBSET_RECORD = "subset.json"
SUBSET_VERSION = 1


def item_hash(subject: str, question: str, choices: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join([subject, question, *choices]).encode("utf-8")).hexdigest()


def allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """Per-subject quotas proportional to sizes, summing to n (largest remainder; ties by subject name)."""
    total = sum(sizes.values())
    if not 0 < n <= total:
        raise ValueError(f"subset size must be in 1..{total}, got {n}")
    exact = {s: n * k / total for s, k in sizes.items()}
    quota = {s: int(x) for s, x in exact.items()}
    by_remainder = sorted(sizes, key=lambda s: (-(exact[s] - quota[s]), s))
    for s in by_remainder[:n - sum(quota.values())]:
        quota[s] += 1
    return dict(sorted(quota.items()))


def choose(rows_by_subject: Mapping[str, Sequence[dict]], n: int) -> dict[str, list[int]]:
    """subject -> the kept rows' indices in its file (ascending): its quota of smallest item hashes."""
    quota = allocate({s: len(rows) for s, rows in rows_by_subject.items()}, n)
    out = {}
    for s, rows in sorted(rows_by_subject.items()):
        ranked = sorted(range(len(rows)), key=lambda i: (item_hash(s, rows[i]["question"], rows[i]["choices"]), i))
        out[s] = sorted(ranked[:quota[s]])
    return out


def read_test_rows(folder: Path) -> dict[str, list[dict]]:
    return {s: read_mmlu_csv(files["test"], s) for s, files in sorted(mmlu_files(folder).items())}


def _write_csv(path: Path, rows: Sequence[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(MMLU_HEADER)
        for r in rows:
            w.writerow([r["question"], *r["choices"], r["answer"]])


def write_subset(mmlu_folder: str | Path, out: str | Path, n: int) -> Path:
    """out/mmlu/{dev,test}/ with the subset of n test items and out/mmlu/subset.json; returns out (a data_dir)."""
    src, out = Path(mmlu_folder), Path(out)
    rows = read_test_rows(src)
    kept = choose(rows, n)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "mmlu" / "test").mkdir(parents=True)
    shutil.copytree(src / "dev", tmp / "mmlu" / "dev")
    for s, idx in kept.items():
        _write_csv(tmp / "mmlu" / "test" / f"{s}_test.csv", [rows[s][i] for i in idx])
    record = {"version": SUBSET_VERSION, "n": n, "n_full": sum(len(r) for r in rows.values()),
              "per_subject": {s: len(i) for s, i in kept.items()}, "full_index": kept}
    (tmp / "mmlu" / SUBSET_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def full_keys(record: Mapping) -> list[str]:
    """The full-MMLU keys ("mmlu_<subject>/<row in the full file>") of the subset's items, in subset order."""
    return [f"mmlu_{s}/{i}" for s, idx in record["full_index"].items() for i in idx]


def restrict(full_values: Mapping[str, float], record: Mapping) -> dict[str, float]:
    """A full-MMLU record's per-item values ("mmlu_<subject>/<doc_id>", doc_id = row in the full file) restricted
    to the subset and keyed as a subset run keys them (doc_id = row in the subset file). Values that lack one of
    the subset's items (a run with a per-subject limit, another data folder) are refused, naming the items."""
    missing = [k for k in full_keys(record) if k not in full_values]
    if missing:
        raise ValueError(f"MMLU values lack {len(missing)} of the subset's {len(full_keys(record))} items "
                         f"(e.g. {', '.join(missing[:3])}): they are not a full run over the subset's source")
    return {f"mmlu_{s}/{j}": full_values[f"mmlu_{s}/{i}"]
            for s, idx in record["full_index"].items() for j, i in enumerate(idx)}


def source_key(mmlu_folder: Path) -> str:
    """sha256 over the test files' names and bytes: a cached subset is reused only for the same source."""
    h = hashlib.sha256()
    for s, files in sorted(mmlu_files(mmlu_folder).items()):
        h.update(s.encode() + b"\0" + hashlib.sha256(files["test"].read_bytes()).digest())
    return h.hexdigest()[:16]


def cached_subset(data_dir: str | Path, n: int, cache: str | Path) -> Path:
    """A data_dir whose mmlu/ is the n-item subset of data_dir/mmlu, built once under cache."""
    src = Path(data_dir) / "mmlu"
    out = Path(cache) / f"mmlu-subset-v{SUBSET_VERSION}-n{n}-{source_key(src)}"
    with file_lock(out.with_name(out.name + ".lock")):  # the two sides of a battery may ask at once
        if not (out / "mmlu" / SUBSET_RECORD).is_file():
            write_subset(src, out, n)
    return out
