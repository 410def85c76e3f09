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
    instruction: str  # appended to the question after a blank line ("": the question alone)
    well_formed: Callable[[str], bool]
    system: str = ""  # a system message before the question ("": none)


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
    # The reference GSM8K protocol: Qwen2.5-Math's chain-of-thought system prompt (Yang et al. 2024, the
    # Qwen2.5-Math report), the question alone as the user turn. Instruct Qwen models answer it in \boxed{}.
    PromptFormat("qwen_boxed", "", _one_boxed,
                 system="Please reason step by step, and put your final answer within \\boxed{}."),
)}


def get_format(name: str, allowed: tuple[str, ...] = tuple(FORMATS)) -> PromptFormat:
    if name not in allowed:
        raise ValueError(f"prompt format {name!r}: allowed: {', '.join(allowed)}")
    return FORMATS[name]


def render(question: str, fmt: PromptFormat) -> str:
    return f"{question.strip()}\n\n{fmt.instruction}" if fmt.instruction else question.strip()


def messages(question: str, fmt: PromptFormat) -> list[dict[str, str]]:
    """The chat turns that ask `question` in `fmt`: the system message when the format has one, then the user's."""
    user = [{"role": "user", "content": render(question, fmt)}]
    return [{"role": "system", "content": fmt.system}, *user] if fmt.system else user
