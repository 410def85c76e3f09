"""Answer formats a prompt can ask for, each with the check that a completion followed it.

The format only changes what is asked and what `check_format` accepts: correctness is scored by the
same robust extraction (answers.py) whatever the format, so a right answer in the wrong form is still
right, and the format reward (rewards.py) is what teaches the form.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from scalelab.evals.answers import last_boxed, parse_number


@dataclass(frozen=True)
class PromptFormat:
    name: str
    instruction: str  # appended to the question after a blank line
    well_formed: Callable[[str], bool]


def _only_number(completion: str) -> bool:
    return parse_number(completion.strip()) is not None and "\n" not in completion.strip()


def _ends_with_hash(completion: str) -> bool:
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    if not lines or completion.count("####") != 1:
        return False
    m = re.fullmatch(r"\s*####\s*(.+?)\s*", lines[-1])
    return m is not None and parse_number(m.group(1)) is not None


def _one_boxed(completion: str) -> bool:
    count = completion.count("\\boxed")
    inner = last_boxed(completion)
    return count == 1 and inner is not None and inner.strip() != ""


FORMATS: dict[str, PromptFormat] = {f.name: f for f in (
    PromptFormat("answer_only", "Answer with only the number.", _only_number),
    PromptFormat("cot_hash", "Think step by step, then write the final answer on the last line as "
                             "\"#### <number>\".", _ends_with_hash),
    PromptFormat("cot_boxed", "Think step by step, then put the final answer in \\boxed{}.", _one_boxed),
)}


def get_format(name: str, allowed: tuple[str, ...] = tuple(FORMATS)) -> PromptFormat:
    if name not in allowed:
        raise ValueError(f"prompt format {name!r}: allowed: {', '.join(allowed)}")
    return FORMATS[name]


def render(question: str, fmt: PromptFormat) -> str:
    return f"{question.strip()}\n\n{fmt.instruction}"
