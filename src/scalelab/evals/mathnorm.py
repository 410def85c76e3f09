"""MATH answers: normalise a boxed LaTeX answer, then decide whether two answers are equivalent.

`is_equiv(pred, gold)` is True when, after `normalize_answer` (a fixed sequence of string rewrites, listed
in STEPS), the strings are equal; or both are sequences (tuples, intervals, sets, comma lists, `a \\pm b`)
whose elements are equivalent (tuples and intervals in order with the same brackets, sets and bare lists in
any order); or both evaluate to the same number, or the same function of the same variables at three fixed
points (so 0.5 = \\frac12 = 1/2, \\frac{\\sqrt{21}}{5} = \\sqrt{21}/5, 2(x+1) = 2x+2).

Evaluation goes through sympy on a string we rebuild token by token from a whitelist (numbers, single-letter
variables, + - * / ** and a few named functions): model output never reaches `eval` as written, and oversized
exponents or numbers are refused rather than computed.
"""
from __future__ import annotations

import re
from typing import Callable

from scalelab.evals.answers import MARKERS, last_boxed, numbers_in
from scalelab.evals.mathexpr import same_value

# ---------------------------------------------------------------------------------------------
# string normalisation


def _unwrap_boxed(s: str) -> str:
    inner = last_boxed(s) if "\\boxed" in s or "\\fbox" in s else None
    return inner if inner is not None else s


def _drop_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left):len(s) - len(right)]
    return s.replace("\\$", "").replace("$", "")


def _matrix_to_tuple(s: str) -> str:
    # \begin{pmatrix} a \\ b \end{pmatrix} -> (a,b); rows of several entries become nested tuples.
    m = re.fullmatch(r"\s*\\begin\{[pbv]?matrix\}(.*)\\end\{[pbv]?matrix\}\s*\.?\s*", s, re.DOTALL)
    if m is None:
        return s
    rows = [r.split("&") for r in re.split(r"\\\\", m.group(1)) if r.strip()]
    cells = [r[0].strip() if len(r) == 1 else "(" + ",".join(c.strip() for c in r) + ")" for r in rows]
    return "(" + ",".join(cells) + ")"


_SPACING = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "\\quad", "\\qquad")


def _drop_spacing(s: str) -> str:
    for cmd in _SPACING:
        s = re.sub(re.escape(cmd) + r"(?![a-zA-Z])", "", s)
    return s.replace("\\ ", " ").replace("~", " ")


def _canonical_commands(s: str) -> str:
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    return s.replace("\\le ", "\\leq ").replace("\\ge ", "\\geq ").replace("\\$", "")


def _drop_degrees(s: str) -> str:
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    return s.replace("°", "").replace("\\degree", "").replace("\\circ", "")


_TEXT_CMDS = r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|mathit|operatorname|boldsymbol)"


def _drop_units(s: str) -> str:
    # "5.4 \text{ cents}", "10\mbox{ inches}^2": a text suffix after a value is a unit; a text alone is the answer.
    unit = re.compile(rf"^(.*\S)\s*{_TEXT_CMDS}\{{\s*[a-zA-Z][a-zA-Z .]*\}}(\^\d)?\s*\.?$")
    while (m := unit.match(s)) and not re.fullmatch(rf".*{_TEXT_CMDS}\{{[^}}]*", m.group(1)):
        s = m.group(1)
    m = re.fullmatch(r"(-?[\d.,]+(?:/\d+)?)\s+(?:[a-zA-Z]{2,}\.?\s*)+", s.strip())  # "18 dollars", "5 cm"
    return m.group(1) if m else s


def _unwrap_text(s: str) -> str:
    return re.sub(rf"{_TEXT_CMDS}\{{([^{{}}]*)\}}", r"\1", s)


def _drop_lhs(s: str) -> str:
    # "x = 3" -> "3", "f(x) = 2x" -> "2x", "x \in [1, 2]" -> "[1, 2]"; "y = 2x + 3" loses its "y =" on both sides.
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if re.fullmatch(r"\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?(?:\([a-z]\))?\s*", lhs):
            return rhs
    m = re.fullmatch(r"\s*[a-zA-Z]\s*\\in\s*(.+)", s)
    return m.group(1) if m else s


def _drop_spaces(s: str) -> str:
    # A space that ends a command name stays ("\cot x" must not become the unknown "\cotx").
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x00", s)
    return re.sub(r"\s+", "", s).replace("\x00", " ")


def _brace_short_args(s: str) -> str:
    # \sqrt2 -> \sqrt{2}, \frac12 -> \frac{1}{2}, \frac1{2} / \frac{1}2 -> \frac{1}{2}
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac(\w)(\w)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\w)\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac(\{[^{}]*\})(\w)", r"\\frac\1{\2}", s)


def _plain_numbers(s: str) -> str:
    s = s.replace("{,}", ",")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # a whole answer of 1,000 is a thousand, not a set
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    s = re.sub(r"(\d\.\d*?)0+(?!\d)", r"\1", s)  # 2.50 -> 2.5
    s = re.sub(r"(\d)\.(?!\d)", r"\1", s)  # 2. -> 2
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    if m:
        return f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    m = re.fullmatch(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}", s)  # mixed number 1\frac{4}{5} = 9/5
    if m:
        whole, num, den = (int(g) for g in m.groups()[1:])
        return f"{m.group(1)}\\frac{{{whole * den + num}}}{{{den}}}"
    return s


def _choice_letter(s: str) -> str:
    m = re.fullmatch(r"\(([A-Z])\)", s)  # "(E)" -> "E": multiple-choice answers
    if m:
        return m.group(1)
    return s.lower() if re.fullmatch(r"[A-Za-z]{2,}", s) else s  # "East" = "east"


def _strip_trailing(s: str) -> str:
    return s.rstrip(".").removeprefix("+") or s


STEPS: tuple[Callable[[str], str], ...] = (
    _unwrap_boxed, _drop_delimiters, _matrix_to_tuple, _drop_spacing, _canonical_commands, _drop_degrees,
    _drop_units, _unwrap_text,
    _drop_units,  # again: "\text{5 cm}" shows its unit only once unwrapped
    _drop_lhs, _drop_spaces, _brace_short_args, _strip_trailing, _plain_numbers, _choice_letter,
)


def normalize_answer(answer: str) -> str:
    """The answer with formatting that does not change its meaning removed (see STEPS, in order)."""
    s = answer.replace("\\%", "").replace("%", "").strip()
    for step in STEPS:
        s = step(s)
    return s


# ---------------------------------------------------------------------------------------------
# sequences: tuples, intervals, sets, lists


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """`s` split at `sep` where it is not inside (), [], {} (so "(1,2),3" is two parts)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i + len(sep)
    parts.append(s[start:])
    return parts


_SET_BRACES = ("\\{", "\\}")


def _brackets(s: str) -> tuple[str, str, str] | None:
    """(open, inner, close) when `s` is one bracketed group like (1,2], \\{3,4\\} or [0,1)."""
    if s.startswith(_SET_BRACES[0]) and s.endswith(_SET_BRACES[1]):
        return "{", s[2:-2], "}"
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and len(split_top_level(s[1:-1], "\\cup")) == 1:
        inner = s[1:-1]
        depth = 0
        for ch in inner:  # "(1,2)\\cup(3,4)" or "(a)(b)" are not one group
            depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
            if depth < 0:
                return None
        return s[0], inner, s[-1]
    return None


def _expand_pm(items: list[str]) -> list[str]:
    out = []
    for item in items:
        out += [item.replace("\\pm", "+", 1), item.replace("\\pm", "-", 1)] if item.count("\\pm") == 1 else [item]
    return out


def _unordered_match(a: list[str], b: list[str]) -> bool:
    if len(a) != len(b):
        return False
    left = list(b)
    for item in a:
        hit = next((k for k, other in enumerate(left) if _equiv_normalized(item, other)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def _same_sequence(a: str, b: str) -> bool:
    ga, gb = _brackets(a), _brackets(b)
    if ga and gb:
        if (ga[0], ga[2]) != (gb[0], gb[2]):
            return False  # (0,1) is not [0,1]
        ia, ib = split_top_level(ga[1]), split_top_level(gb[1])
        if ga[0] == "{":
            return _unordered_match(_expand_pm(ia), _expand_pm(ib))
        return len(ia) == len(ib) > 1 and all(_equiv_normalized(x, y) for x, y in zip(ia, ib))
    if ga or gb:
        return False
    ia, ib = split_top_level(a, "\\cup"), split_top_level(b, "\\cup")
    if len(ia) == 1 and len(ib) == 1:
        ia, ib = _expand_pm(split_top_level(a)), _expand_pm(split_top_level(b))
    return (len(ia) > 1 or len(ib) > 1) and _unordered_match(ia, ib)


# ---------------------------------------------------------------------------------------------
# equivalence and extraction


def _equiv_normalized(a: str, b: str) -> bool:
    return a == b or _same_sequence(a, b) or same_value(a, b)


def is_equiv(pred: str | None, gold: str) -> bool:
    """Whether a predicted answer means the same as the gold one (rules in the module docstring)."""
    if pred is None:
        return False
    a, b = normalize_answer(pred), normalize_answer(gold)
    return bool(a) and _equiv_normalized(a, b)


def extract_math_answer(completion: str) -> tuple[str | None, str]:
    """(answer text, method): the last \\boxed{}, else a '####' / 'answer is' span, else the last number."""
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    for method, find in MARKERS:
        span = find(completion)
        if span is not None and span.strip():
            return span.strip().rstrip("."), method
    found = numbers_in(completion)
    return (found[-1][0], "last-number") if found else (None, "none")
