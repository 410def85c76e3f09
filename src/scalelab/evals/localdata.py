"""Local copies of the evaluation sets -> the row schema of their hub versions, as cached jsonl for lm-eval.

    hellaswag      hellaswag/hellaswag_val_full.txt.bz2   llama.cpp text, 6 lines/item   -> Rowan/hellaswag rows
    arc_easy       llmfoundry_icl/arc_easy.jsonl          Mosaic {query, choices, gold}  -> allenai/ai2_arc rows
    arc_challenge  llmfoundry_icl/arc_challenge.jsonl     Mosaic {query, choices, gold}  -> allenai/ai2_arc rows
    piqa           llmfoundry_icl/piqa.jsonl              Mosaic {query, choices, gold}  -> ybisk/piqa rows
    mmlu           mmlu/{dev,test}/<subject>_<split>.csv  question,choice0..3,answer     -> cais/mmlu rows
    truthfulqa     truthfulqa/mc_task.json                [{question, mc1/mc2_targets}]  -> truthful_qa multiple_choice

Writing the hub schema lets the task definitions in `scalelab/evals/lmeval/` use the same doc_to_text /
doc_to_choice / process_docs as lm-eval's hub tasks. A converted set is a folder

    <cache>/<name>-v<FORMAT_VERSION>-<sha256[:16]>/{<split>.jsonl ..., manifest.json}

keyed by the sha256 of the source file (for MMLU's 114 files: of their names and sha256s), written under
a temporary name and renamed into place, so a reader sees a complete folder or none.
"""
from __future__ import annotations

import bz2
import csv
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from scalelab.core import errors

# Part of the cache key: bump it when a converter's output changes, so stale folders are not reused.
FORMAT_VERSION = 1
MMLU_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]
HELLASWAG_LINES_PER_ITEM = 6  # "label: ctx", gold index, 4 endings (llama.cpp's extract_hellaswag.cpp)
QUESTION_PREFIX = "Question: "


class LocalDataError(errors.DataError, ValueError):
    """A local data file is missing or malformed; the message names the file and line."""


def _bad(path: Path, line: int | str, what: str) -> LocalDataError:
    return LocalDataError(f"{path}:{line}: {what}")


# ---------------------------------------------------------------------------------------------
# HellaSwag (llama.cpp text form)

# The hub row has ctx = ctx_a + " " + ctx_b, where ActivityNet's ctx_b is the lower-cased start of the
# sentence to complete ("... on a roof. he") and WikiHow's is empty. lm-eval capitalizes ctx_b, so it is
# recovered here as a trailing lower-case fragment after the last sentence end.
_CTX_B = re.compile(r"^(?P<a>.*[.!?]) (?P<b>[a-z][^.!?]*)$", re.DOTALL)


def split_context(ctx: str) -> tuple[str, str]:
    """ctx -> (ctx_a, ctx_b); ctx_b is "" when the context ends a sentence (all WikiHow items)."""
    m = _CTX_B.match(ctx)
    return (m["a"], m["b"]) if m else (ctx, "")


def _hellaswag_item(path: Path, first_line: int, lines: list[str]) -> dict:
    header, gold, *endings = lines
    label, sep, ctx = header.partition(": ")
    if not sep or not label or not ctx:
        raise _bad(path, first_line, f"expected 'activity label: context', got {header[:80]!r}")
    if gold not in ("0", "1", "2", "3"):
        raise _bad(path, first_line + 1, f"expected the gold ending index 0-3, got {gold[:80]!r}")
    for k, ending in enumerate(endings):
        if not ending.strip():
            raise _bad(path, first_line + 2 + k, "empty ending")
    ctx_a, ctx_b = split_context(ctx)
    return {"ind": (first_line - 1) // HELLASWAG_LINES_PER_ITEM, "activity_label": label, "ctx_a": ctx_a,
            "ctx_b": ctx_b, "ctx": ctx, "endings": endings, "label": gold}


def read_hellaswag(path: Path) -> dict[str, list[dict]]:
    try:
        text = bz2.decompress(path.read_bytes()).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(path, 1, f"not bz2-compressed UTF-8 text ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    n = HELLASWAG_LINES_PER_ITEM
    if len(lines) % n:
        start = len(lines) - len(lines) % n + 1
        raise _bad(path, start, f"truncated item: {len(lines) % n} line(s) where {n} are expected")
    return {"validation": [_hellaswag_item(path, i + 1, lines[i:i + n]) for i in range(0, len(lines), n)]}


# ---------------------------------------------------------------------------------------------
# ARC / PIQA (Mosaic eval-gauntlet multiple choice)


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(path, i, f"invalid JSON ({e.msg})") from None


def read_icl_mc(path: Path, n_choices: int | None = None) -> Iterator[tuple[int, str, list[str], int]]:
    """(line, question, choices, gold) per row; the question is the query without its "Question: " prefix."""
    for i, row in _iter_jsonl(path):
        if not isinstance(row, dict) or not {"query", "choices", "gold"} <= set(row):
            raise _bad(path, i, "expected an object with keys query, choices, gold")
        query, choices, gold = row["query"], row["choices"], row["gold"]
        if not isinstance(query, str) or not query.startswith(QUESTION_PREFIX):
            raise _bad(path, i, f"query must be a string starting with {QUESTION_PREFIX!r}, got {query!r:.80}")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise _bad(path, i, f"choices must be a list of at least 2 strings, got {choices!r:.80}")
        if n_choices is not None and len(choices) != n_choices:
            raise _bad(path, i, f"expected {n_choices} choices, got {len(choices)}")
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
            raise _bad(path, i, f"gold must be an index into the {len(choices)} choices, got {gold!r}")
        # PIQA's query ends "\n" (Mosaic's own prompt break), ARC's does not; neither belongs to the question.
        yield i, query[len(QUESTION_PREFIX):].removesuffix("\n"), choices, gold


def read_arc(path: Path) -> dict[str, list[dict]]:
    rows = []
    for i, question, choices, gold in read_icl_mc(path):
        labels = [chr(ord("A") + k) for k in range(len(choices))]
        rows.append({"id": f"{path.stem}-{i}", "question": question, "choices": {"text": choices, "label": labels},
                     "answerKey": labels[gold]})
    return {"test": rows}


def read_piqa(path: Path) -> dict[str, list[dict]]:
    rows = [{"goal": goal, "sol1": choices[0], "sol2": choices[1], "label": gold}
            for _, goal, choices, gold in read_icl_mc(path, n_choices=2)]
    return {"validation": rows}


# ---------------------------------------------------------------------------------------------
# MMLU (one csv per subject and split)


def read_mmlu_csv(path: Path, subject: str) -> list[dict]:
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != MMLU_HEADER:
            raise _bad(path, 1, f"expected header {','.join(MMLU_HEADER)}, got {header!r}")
        for row in reader:
            line = reader.line_num  # the row's last physical line: a quoted field may span several
            if len(row) != len(MMLU_HEADER):
                raise _bad(path, line, f"expected {len(MMLU_HEADER)} fields, got {len(row)}")
            if row[5] not in ("0", "1", "2", "3"):
                raise _bad(path, line, f"answer must be a choice index 0-3, got {row[5]!r}")
            if not row[0].strip():
                raise _bad(path, line, "empty question")
            rows.append({"question": row[0], "subject": subject, "choices": row[1:5], "answer": int(row[5])})
    return rows


def mmlu_files(folder: Path) -> dict[str, dict[str, Path]]:
    """subject -> {"dev": csv, "test": csv}; each subject must have both."""
    found: dict[str, dict[str, Path]] = {}
    for split in ("dev", "test"):
        for path in sorted((folder / split).glob(f"*_{split}.csv")):
            found.setdefault(path.name.removesuffix(f"_{split}.csv"), {})[split] = path
    if not found:
        raise LocalDataError(f"{folder}: no <subject>_dev.csv / <subject>_test.csv files under dev/ and test/")
    for subject, splits in found.items():
        if set(splits) != {"dev", "test"}:
            missing = ({"dev", "test"} - set(splits)).pop()
            raise LocalDataError(f"{folder / missing / f'{subject}_{missing}.csv'}: not found (subject {subject} "
                                 f"has a {set(splits).pop()} file)")
    return found


def read_mmlu(folder: Path) -> dict[str, list[dict]]:
    """<subject>_<split> -> rows: one file per subject and split, as each subject task reads its own."""
    return {f"{subject}_{split}": read_mmlu_csv(path, subject)
            for subject, splits in sorted(mmlu_files(folder).items()) for split, path in sorted(splits.items())}


# ---------------------------------------------------------------------------------------------
# TruthfulQA (mc_task.json)


def _iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, item) for each element of a top-level JSON array; the file is one long line, so the line
    number alone would not locate an item: errors give line:column."""
    text = path.read_text(encoding="utf-8")
    decoder, ws = json.JSONDecoder(), re.compile(r"\s*")

    def where(pos: int) -> str:
        return f"{text.count(chr(10), 0, pos) + 1}:{pos - text.rfind(chr(10), 0, pos)}"

    pos = ws.match(text, 0).end()
    if text[pos:pos + 1] != "[":
        raise _bad(path, where(pos), "expected a JSON array of questions")
    pos = ws.match(text, pos + 1).end()
    while text[pos:pos + 1] != "]":
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise _bad(path, where(e.pos), f"invalid JSON ({e.msg})") from None
        yield where(pos), item
        pos = ws.match(text, end).end()
        if text[pos:pos + 1] == ",":
            pos = ws.match(text, pos + 1).end()
        elif text[pos:pos + 1] != "]":
            raise _bad(path, where(pos), "expected ',' or ']' after an item")


def _mc_targets(path: Path, where: str, item: dict, key: str, exactly_one_true: bool) -> dict:
    targets = item.get(key)
    if not isinstance(targets, dict) or not targets or not all(v in (0, 1) for v in targets.values()):
        raise _bad(path, where, f"{key} must map answer text to 0/1, got {targets!r:.80}")
    labels = [int(v) for v in targets.values()]
    if (sum(labels) != 1) if exactly_one_true else (not 0 < sum(labels) < len(labels)):
        rule = "exactly one true answer" if exactly_one_true else "at least one true and one false answer"
        raise _bad(path, where, f"{key} needs {rule}, got labels {labels}")
    return {"choices": list(targets), "labels": labels}


def read_truthfulqa(path: Path) -> dict[str, list[dict]]:
    rows = []
    for where, item in _iter_json_array(path):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or not item["question"].strip():
            raise _bad(path, where, "expected an object with a non-empty 'question'")
        rows.append({"question": item["question"],
                     "mc1_targets": _mc_targets(path, where, item, "mc1_targets", exactly_one_true=True),
                     "mc2_targets": _mc_targets(path, where, item, "mc2_targets", exactly_one_true=False)})
    return {"validation": rows}


# ---------------------------------------------------------------------------------------------
# registry and cache


@dataclass(frozen=True)
class LocalDataset:
    name: str
    source: str                                   # path under the data folder (a file, or MMLU's folder)
    read: Callable[[Path], dict[str, list[dict]]]  # source -> {split file stem: hub-schema rows}


DATASETS: dict[str, LocalDataset] = {d.name: d for d in (
    LocalDataset("hellaswag", "hellaswag/hellaswag_val_full.txt.bz2", read_hellaswag),
    LocalDataset("arc_easy", "llmfoundry_icl/arc_easy.jsonl", read_arc),
    LocalDataset("arc_challenge", "llmfoundry_icl/arc_challenge.jsonl", read_arc),
    LocalDataset("piqa", "llmfoundry_icl/piqa.jsonl", read_piqa),
    LocalDataset("mmlu", "mmlu", read_mmlu),
    LocalDataset("truthfulqa", "truthfulqa/mc_task.json", read_truthfulqa),
)}


@dataclass(frozen=True)
class ConvertedData:
    name: str
    source: str                          # the file (or folder) converted
    source_sha256: str
    folder: str                          # holds <split>.jsonl and manifest.json
    rows: tuple[tuple[str, int], ...]    # (split file stem, row count)

    def file(self, stem: str) -> Path:
        return Path(self.folder) / f"{stem}.jsonl"

    @property
    def n_rows(self) -> int:
        return sum(n for _, n in self.rows)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_sha256(path: Path) -> str:
    """A file's sha256; a folder's is the sha256 of its csv files' relative names and sha256s."""
    if path.is_file():
        return file_sha256(path)
    listing = "".join(f"{p.relative_to(path).as_posix()} {file_sha256(p)}\n" for p in sorted(path.rglob("*.csv")))
    return hashlib.sha256(listing.encode()).hexdigest()


def default_cache_dir() -> Path:
    if os.environ.get("SCALELAB_CACHE_DIR"):
        return Path(os.environ["SCALELAB_CACHE_DIR"]) / "lmeval"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scalelab" / "lmeval"


def write_folder(target: Path, files: Mapping[str, str]) -> None:
    """Write {relative path: text} into a temporary sibling, then rename it to `target`: readers see the
    folder complete or not at all, and of two processes racing, the first rename wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text, encoding="utf-8")
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared
    try:
        os.rename(tmp, target)
    except OSError:  # the other process's identical copy is in place
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def convert(name: str, data_dir: str | Path, cache_dir: str | Path | None = None) -> ConvertedData:
    """The converted copy of local dataset `name`, made once per source sha256 and reused after."""
    if name not in DATASETS:
        raise KeyError(f"unknown local dataset {name!r}; known: {', '.join(DATASETS)}")
    spec = DATASETS[name]
    source = Path(data_dir) / spec.source
    if not source.exists():
        raise LocalDataError(f"{source}: not found (local {name} data; set --data-dir to the shared data folder)")
    sha = source_sha256(source)
    target = Path(cache_dir or default_cache_dir()) / f"{name}-v{FORMAT_VERSION}-{sha[:16]}"
    if not (target / "manifest.json").is_file():
        splits = spec.read(source)
        empty = [stem for stem, rows in splits.items() if not rows]
        if empty or not splits:
            raise LocalDataError(f"{source}: no items{f' for {empty[0]}' if empty else ''}")
        manifest = {"name": name, "source": str(source), "source_sha256": sha, "format_version": FORMAT_VERSION,
                    "rows": {stem: len(rows) for stem, rows in splits.items()}}
        files = {f"{stem}.jsonl": _jsonl(rows) for stem, rows in splits.items()}
        write_folder(target, {**files, "manifest.json": json.dumps(manifest, indent=2) + "\n"})
    manifest = json.loads((target / "manifest.json").read_text())
    return ConvertedData(name=name, source=str(source), source_sha256=sha, folder=str(target),
                         rows=tuple(sorted(manifest["rows"].items())))
