"""Math word problems with checkable answers: GSM8K (a number after '####') and MATH-500 (a boxed LaTeX
answer). MATH-500's held-out partner is the MATH train set (7,500 problems, disjoint from its test set,
which MATH-500 is drawn from), so `math500` trains on "train" and evaluates on "test".
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from scalelab.evals.answers import (Extracted, extract_number, format_number, gsm8k_gold, last_boxed, numbers_in,
                                    parse_number)
from scalelab.evals.mathnorm import extract_math_answer, is_equiv, normalize_answer
from scalelab.evals.prompts import get_format, messages
from scalelab.evals.tasks import (
    DataError, Example, Resolved, Score, check_split, hub_records, read_records, register_task,
    require_fields, resolve_source, take,
)


# Where each prompt format asks for the answer: the strict score reads only that marker.
ASKED_MARKER = {"cot_hash": "####", "cot_boxed": "boxed", "qwen_boxed": "boxed"}


def _first_number(span: str | None, method: str) -> Extracted:
    found = numbers_in(span) if span else []
    return Extracted(found[0][0], found[0][1], method) if found else Extracted(None, None, "none")


def extract_reference(completion: str) -> Extracted:
    """The reference GSM8K protocol's lenient reading: the last \\boxed{}'s first number, else the last number
    in the text (no '####' or 'answer is' rules: the protocol asks for a box and pays nothing else extra)."""
    got = _first_number(last_boxed(completion), "boxed")
    if got.value is not None:
        return got
    found = numbers_in(completion)
    return Extracted(found[-1][0], found[-1][1], "last-number") if found else Extracted(None, None, "none")


def extract_strict(example: Example, completion: str) -> Extracted:
    """The answer only where the prompt asked for it (the '####' line or the last \\boxed{}); nothing else."""
    marker = ASKED_MARKER.get(example.meta.get("prompt_format", ""))
    if marker == "####":
        found = [m.strip() for m in completion.split("####")[1:]]
        return _first_number(found[-1] if found else None, "####")
    if marker == "boxed":
        return _first_number(last_boxed(completion), "boxed")
    return Extracted(None, None, "none")


def strict_correct(example: Example, completion: str) -> bool:
    """Right in the asked-for form: the strict column of the reference protocol."""
    gold, got = parse_number(example.answer), extract_strict(example, completion)
    return gold is not None and got.value == gold


def score_numeric(example: Example, completion: str) -> Score:
    """Exact numeric match of the extracted final answer against the gold number: the reference protocol's
    lenient rule for its own prompt format, the robust extraction (answers.py) for the others."""
    gold = parse_number(example.answer)
    fmt = example.meta.get("prompt_format")
    got = extract_reference(completion) if fmt == "qwen_boxed" else extract_number(completion)
    if got.value is None:
        return Score(False, None, "no number in the completion")
    ok = gold is not None and got.value == gold
    verdict = "correct" if ok else "wrong"
    return Score(ok, format_number(got.value),
                 f"{verdict}: got {format_number(got.value)}, expected {example.answer} (by {got.method})")


def check_prompt_format(example: Example, completion: str) -> bool:
    return get_format(example.meta["prompt_format"]).well_formed(completion)


def split_file(resolved: Resolved, split: str, pattern: str) -> list[Path]:
    """The local files of `split`: the source itself when it is a file, else `pattern` in the folder."""
    root = Path(resolved.where)
    if root.is_file():
        return [root]
    files = sorted(root.glob(pattern.format(split=split)))
    if not files:
        raise DataError(f"{root}: no {pattern.format(split=split)} here")
    return files


# ---------------------------------------------------------------------------------------------
# GSM8K


@register_task("gsm8k")
@dataclass(frozen=True)
class GSM8K:
    prompt_format: str = "cot_hash"
    name: ClassVar[str] = "gsm8k"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    hub_id: ClassVar[str] = "openai/gsm8k"

    def __post_init__(self) -> None:
        get_format(self.prompt_format)

    def _rows(self, split: str, source: str) -> list[tuple[str, dict[str, Any]]]:
        resolved = resolve_source(source, "gsm8k", self.hub_id)
        if resolved.kind == "hub":
            return [(f"{resolved.where} {split} row {i}", r) for i, r in
                    enumerate(hub_records(resolved.where, split, "main"))]
        path = split_file(resolved, split, "{split}.jsonl")[0]
        return [(f"{path}: line {i + 1}", r) for i, r in enumerate(read_records(path))]

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        fmt = get_format(self.prompt_format)
        out = []
        for i, (where, row) in enumerate(take(self._rows(split, source), limit)):
            require_fields(row, ("question", "answer"), where)
            try:
                gold = gsm8k_gold(row["answer"])
            except ValueError as e:
                raise DataError(f"{where}: {e}") from None
            out.append(Example(self.name, f"gsm8k/{split}/{i}", messages(row["question"], fmt),
                               format_number(gold), {"prompt_format": fmt.name, "solution": row["answer"]}))
        return out

    def score(self, example: Example, completion: str) -> Score:
        return score_numeric(example, completion)

    def check_format(self, example: Example, completion: str) -> bool:
        return check_prompt_format(example, completion)


# ---------------------------------------------------------------------------------------------
# MATH-500 (test) and MATH (train)

MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")


def _math_train_rows(source: str) -> list[tuple[str, dict[str, Any]]]:
    resolved = resolve_source(source, "math", "EleutherAI/hendrycks_math")
    if resolved.kind == "hub":
        return [(f"{resolved.where}/{s} train row {i}", r) for s in MATH_SUBJECTS
                for i, r in enumerate(hub_records(resolved.where, "train", s))]
    root = Path(resolved.where)
    files = [root] if root.is_file() else sorted(root.glob("train_by_subject/*.jsonl")) or sorted(root.glob("*.jsonl"))
    if not files:
        raise DataError(f"{root}: no train_by_subject/*.jsonl (MATH train) files here")
    return [(f"{f}: line {i + 1}", r) for f in files for i, r in enumerate(read_records(f))]


def _without_answerless(rows: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """MATH train rows whose solution boxes an answer. The published data has two rows with an empty
    \\boxed{} (number_theory lines 850 and 852): they cannot be scored, so each is dropped with a warning."""
    kept = []
    for where, row in rows:
        if (last_boxed(str(row.get("solution", ""))) or "").strip():
            kept.append((where, row))
        else:
            warnings.warn(f"{where}: skipped: no answer in the solution's \\boxed{{}}", stacklevel=3)
    return kept


def _math500_rows(source: str) -> list[tuple[str, dict[str, Any]]]:
    resolved = resolve_source(source, "math500", "HuggingFaceH4/MATH-500")
    if resolved.kind == "hub":
        return [(f"{resolved.where} test row {i}", r) for i, r in enumerate(hub_records(resolved.where, "test"))]
    path = split_file(resolved, "test", "{split}.jsonl")[0]
    return [(f"{path}: line {i + 1}", r) for i, r in enumerate(read_records(path))]


def math_example(row: dict[str, Any], where: str, fmt_name: str, task: str) -> Example:
    require_fields(row, ("problem", "solution"), where)
    answer = row.get("answer") or last_boxed(row["solution"])  # MATH train rows carry only the solution
    if not answer:
        raise DataError(f"{where}: no answer field and no \\boxed{{}} in the solution")
    meta = {"prompt_format": fmt_name, "subject": row.get("subject") or row.get("type", ""),
            "level": row.get("level"), "solution": row["solution"]}
    return Example(task, row.get("unique_id") or where, messages(row["problem"], get_format(fmt_name)),
                   answer, meta)


@register_task("math500")
@dataclass(frozen=True)
class Math500:
    prompt_format: str = "cot_boxed"
    name: ClassVar[str] = "math500"
    splits: ClassVar[tuple[str, ...]] = ("test", "train")
    formats: ClassVar[tuple[str, ...]] = ("cot_boxed", "qwen_boxed")  # "#### <number>" does not fit LaTeX answers

    def __post_init__(self) -> None:
        get_format(self.prompt_format, self.formats)

    def load(self, split: str, source: str = "", limit: int | None = None, seed: int = 0) -> list[Example]:
        check_split(self.name, split, self.splits)
        rows = _math500_rows(source) if split == "test" else _without_answerless(_math_train_rows(source))
        return [math_example(row, where, self.prompt_format, self.name) for where, row in take(rows, limit)]

    def score(self, example: Example, completion: str) -> Score:
        extracted, method = extract_math_answer(completion)
        if extracted is None:
            return Score(False, None, "no answer in the completion")
        ok = is_equiv(extracted, example.answer)
        verdict = "correct" if ok else "wrong"
        return Score(ok, extracted, f"{verdict}: got {normalize_answer(extracted)!r}, expected "
                                    f"{normalize_answer(example.answer)!r} (by {method})")

    def check_format(self, example: Example, completion: str) -> bool:
        return check_prompt_format(example, completion)
