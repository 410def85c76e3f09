"""Find the final numeric answer in a model's completion, and compare numbers exactly.

Extraction order (the first rule that yields a number wins; within a rule the LAST occurrence counts,
because models restate intermediate results before concluding):
  1. `#### N`            GSM8K's own marker (the chain-of-thought prompt asks for it)
  2. `\\boxed{N}`         the MATH convention, also common from instruct models on GSM8K
  3. `answer is N` / `answer: N` / `final answer = N`
  4. the last number anywhere in the text (an answer hidden in reasoning, no marker)
Within a marked span the FIRST number is taken ("#### 18 dollars since 9 * 2" -> 18).

A number may carry a currency sign ("$18"), units ("18 dollars"), trailing zeros ("18.00"), thousands
separators ("1,000", LaTeX "1{,}000"), a sign ("-3", Unicode "−3"; "5-3" is 5 and 3, not -3), a percent
sign ("50%" -> 50), or be a fraction ("3/4", "\\frac{3}{4}", "\\dfrac34"). Values are `Fraction`s, so
"18", "18.0" and "36/2" are equal and 0.1 + 0.2 pitfalls do not arise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Callable

# A sign counts only where it cannot be a binary minus: at the start, or after a space/opening/operator.
_SIGN = r"(?:(?<![\w)\]}.])[-−–])?"
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
# Digits must not continue a word or another number ("x2", "1.2.3" parts, "v10").
NUMBER_RE = re.compile(
    rf"(?P<sign>{_SIGN})\$?\s?(?<![\w.])(?P<num>{_UNSIGNED})(?:\s*/\s*(?P<den>\d+)(?!\.?\d))?")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*(?:\{\s*([-−]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")


@dataclass(frozen=True)
class Extracted:
    text: str | None  # the number as written, e.g. "$1,000" (None when nothing was found)
    value: Fraction | None
    method: str  # "####" | "boxed" | "answer-is" | "last-number" | "none"


def clean_numbers(text: str) -> str:
    """Rewrite LaTeX number spellings into plain ones: \\frac{3}{4} -> 3/4, 1{,}000 -> 1,000, \\$ -> $."""
    text = text.replace("{,}", ",").replace("\\!", "").replace("\\$", "$").replace("\\%", "%")
    return _LATEX_FRAC.sub(lambda m: f"{m.group(1) or m.group(2)}/{m.group(3) or m.group(4)}", text)


MAX_NUMBER_CHARS = 60  # a longer digit run is noise (or an attack on int parsing), not an answer


def _value(match: re.Match) -> Fraction | None:
    if len(match.group("num")) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Fraction(Decimal(match.group("num").replace(",", "")))
    except (InvalidOperation, ValueError):
        return None
    den = match.group("den")
    if den is not None:
        if int(den) == 0:
            return None
        value /= int(den)
    return -value if match.group("sign") else value


def numbers_in(text: str) -> list[tuple[str, Fraction]]:
    """Every number in `text`, in order, as (text as written, value)."""
    out = []
    for m in NUMBER_RE.finditer(clean_numbers(text)):
        value = _value(m)
        if value is not None:
            out.append((m.group(0).strip(), value))
    return out


def parse_number(text: str) -> Fraction | None:
    """The value of a string that is one number, maybe with a currency sign before it and %, units or
    a period after it ("$18", "18 dollars", "18."); None for anything else ("It is 18", "18 or 19")."""
    cleaned = clean_numbers(text)
    matches = [m for m in NUMBER_RE.finditer(cleaned) if _value(m) is not None]
    if len(matches) != 1:
        return None
    m = matches[0]
    before, after = cleaned[:m.start()], cleaned[m.end():]
    if re.fullmatch(r"\s*\$?\s*", before) and re.fullmatch(r"\s*%?\s*(?:[A-Za-z]+\s*){0,3}\.?\s*", after):
        return _value(m)
    return None


def format_number(value: Fraction) -> str:
    """18, -2.5, 1/3: an integer, a terminating decimal, or an exact fraction."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    return format(Decimal(value.numerator) / Decimal(value.denominator), "f") if den == 1 else str(value)


# ---------------------------------------------------------------------------------------------
# answer markers


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; `\\boxed 5` too."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    after = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    i = after
    while i < len(text) and text[i] == " ":
        i += 1
    if not text.startswith("{", i):
        m = re.match(r"([^\s$]+)", text[i:]) if i > after else None  # "\boxed 5": the next token
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unbalanced: cut off mid-answer


def _hash_span(text: str) -> str | None:
    found = re.findall(r"####[ \t]*([^\n]*)", text)
    return found[-1] if found else None


_ANSWER_IS = re.compile(r"(?:final\s+answer|\banswer)\s*(?:is|:|=|would be|will be)\s*:?\s*([^\n]*)",
                        re.IGNORECASE)


def _answer_is_span(text: str) -> str | None:
    found = _ANSWER_IS.findall(text)
    return found[-1] if found else None


# Marker rules in priority order: (method name, text -> answer span or None).
MARKERS: tuple[tuple[str, Callable[[str], str | None]], ...] = (
    ("####", _hash_span),
    ("boxed", last_boxed),
    ("answer-is", _answer_is_span),
)


def marked_span(text: str) -> tuple[str, str] | None:
    """(method, span) of the highest-priority answer marker present, or None."""
    for method, find in MARKERS:
        span = find(text)
        if span is not None and span.strip():
            return method, span
    return None


def extract_number(text: str) -> Extracted:
    """The final numeric answer of a completion, by the rules in the module docstring."""
    for method, find in MARKERS:
        span = find(text)
        found = numbers_in(span) if span else []
        if found:
            return Extracted(found[0][0], found[0][1], method)
    found = numbers_in(text)
    if found:
        return Extracted(found[-1][0], found[-1][1], "last-number")
    return Extracted(None, None, "none")


def gsm8k_gold(answer: str) -> Fraction:
    """The number after GSM8K's '####' in a reference solution; ValueError when there is none."""
    span = _hash_span(answer)
    value = parse_number(span) if span is not None else None
    if value is None:
        raise ValueError(f"no '#### <number>' in the GSM8K answer: {answer[-80:]!r}")
    return value
