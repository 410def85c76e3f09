"""Evaluate a normalised LaTeX answer as a sympy expression, safely, to compare values numerically.

The LaTeX is rewritten into Python syntax (\\frac{a}{b} -> ((a)/(b)), \\sqrt[n]{x} -> ((x)**(1/(n))),
^{k} -> **(k), \\pi -> pi, implicit products made explicit), then re-tokenised against a whitelist: numbers,
single-letter variables, + - * / ** ( ) and the functions in FUNCTIONS. Anything else (an unknown command,
an attribute access, a string, an underscore) makes the answer "not evaluable" instead of reaching
sympy's parser, which evaluates Python. Exponents and literals are bounded so "9^9^9^9" cannot hang a
reward function.
"""
from __future__ import annotations

import cmath
import re

import sympy

FUNCTIONS = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot,
             "sec": sympy.sec, "csc": sympy.csc, "log": sympy.log, "exp": sympy.exp, "binomial": sympy.binomial,
             "pi": sympy.pi}
COMMANDS = {"pi": "pi", "cdot": "*", "times": "*", "div": "/", "ln": "log", "log": "log", "sin": "sin",
            "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc", "exp": "exp"}
MAX_EXPONENT = 1000  # larger (compounded) exponents are refused, not computed
MAX_DIGITS = 40
MAX_CHARS = 400  # longer answers are compared as strings only
POINTS = ((0.5377, 1.8339), (-2.2588, 0.8622), (0.3188, -1.3077))  # fixed: equality is reproducible


class NotEvaluable(ValueError):
    """The answer uses syntax outside the evaluable whitelist."""


def _argument(s: str, i: int) -> tuple[str, int]:
    """The braced group or single character at s[i:], and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise NotEvaluable("missing argument")
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1:j], j + 1
    raise NotEvaluable("unbalanced braces")


def _command(s: str, i: int) -> tuple[str, int]:
    """Translate the LaTeX command at s[i] == '\\'; returns (python text, index after)."""
    name = re.match(r"\\([a-zA-Z]+)", s[i:])
    if name is None:
        raise NotEvaluable(f"stray backslash in {s!r}")
    cmd, i = name.group(1), i + len(name.group(0))
    if cmd in ("frac", "binom"):
        a, i = _argument(s, i)
        b, i = _argument(s, i)
        a, b = latex_to_python(a), latex_to_python(b)
        return (f"(({a})/({b}))" if cmd == "frac" else f"binomial({a},{b})"), i
    if cmd == "sqrt":
        root = re.match(r"\[([^\]]+)\]", s[i:])
        if root:
            i += len(root.group(0))
        arg, i = _argument(s, i)
        arg = latex_to_python(arg)
        return (f"(({arg})**(1/({latex_to_python(root.group(1))})))" if root else f"sqrt({arg})"), i
    if cmd in COMMANDS:
        return f" {COMMANDS[cmd]} ", i
    raise NotEvaluable(f"unsupported command \\{cmd}")


def latex_to_python(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            text, i = _command(s, i)
        elif ch == "^":
            arg, i = _argument(s, i + 1)
            text = f"**({latex_to_python(arg)})"
        elif ch == "{":
            arg, i = _argument(s, i)
            text = f"({latex_to_python(arg)})"
        else:
            text, i = ch, i + 1
        out.append(text)
    return "".join(out)


_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([A-Za-z]+)|(\*\*|[-+*/(),]))")  # "," for binomial(n,k)


def _tokens(py: str) -> list[tuple[str, str]]:
    """(kind, text) with kind in num/name/func/op; multi-letter non-function names split into letters."""
    out, pos = [], 0
    while pos < len(py.rstrip()):
        m = _TOKEN.match(py, pos)
        if m is None:
            raise NotEvaluable(f"unexpected {py[pos:pos + 10]!r}")
        num, name, op = m.groups()
        pos = m.end()
        if num is not None:
            if len(num) > MAX_DIGITS:
                raise NotEvaluable("number too long")
            out.append(("num", num))
        elif name is not None:
            out += [("func", name)] if name in FUNCTIONS else [("name", c) for c in name]
        else:
            out.append(("op", op))
    return out


def _explicit_products(tokens: list[tuple[str, str]]) -> str:
    """Join tokens, inserting '*' where LaTeX multiplies by juxtaposition: 2x, 2\\sqrt{3}, (a)(b), x y."""
    out: list[str] = []
    prev = None
    for kind, text in tokens:
        ends_operand = prev is not None and (prev[0] in ("num", "name") or prev == ("op", ")")
                                             or prev == ("func", "pi"))
        starts_operand = kind in ("num", "name", "func") or text == "("
        if ends_operand and starts_operand:
            out.append("*")
        bare_argument = prev is not None and prev[0] == "func" and prev[1] != "pi" and text != "("
        out.append(f"({text})" if bare_argument and kind in ("num", "name") else text)
        prev = (kind, text)
    return "".join(out)


def _power_size(expr: sympy.Basic) -> float:
    """The largest effective exponent in `expr`: (a^m)^n counts m*n; a symbolic exponent holding a power
    (a tower) is infinite."""
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if exponent.is_number:
            size = abs(complex(exponent.evalf(15)))
        else:
            size = float("inf") if exponent.has(sympy.Pow) else 1.0
        return size * max(1.0, _power_size(base), _power_size(exponent))
    return max((_power_size(a) for a in expr.args), default=1.0)


def to_sympy(latex: str) -> sympy.Expr:
    """A sympy expression for a normalised LaTeX answer; NotEvaluable when outside the whitelist."""
    py = _explicit_products(_tokens(latex_to_python(latex)))
    if not py.strip():
        raise NotEvaluable("empty")
    names = {c: sympy.Symbol(c) for c in set(re.findall(r"[A-Za-z]+", py)) if c not in FUNCTIONS}
    names["i"] = sympy.I  # MATH writes complex answers as a + bi
    allowed = {"__builtins__": {}, **FUNCTIONS, "Integer": sympy.Integer, "Float": sympy.Float,
               "Rational": sympy.Rational, "Symbol": sympy.Symbol, "Add": sympy.Add, "Mul": sympy.Mul,
               "Pow": sympy.Pow}
    try:
        # evaluate=False: nothing is computed before the size check has seen the whole tree.
        expr = sympy.parse_expr(py, local_dict=names, global_dict=allowed, evaluate=False)
    except Exception as e:  # sympy's parser raises many types (TokenError, IndexError...) on odd input
        raise NotEvaluable(f"{type(e).__name__}: {e}") from None
    if not isinstance(expr, sympy.Expr):
        raise NotEvaluable(f"not an expression: {type(expr).__name__}")
    try:
        too_big = _power_size(expr) > MAX_EXPONENT  # checked before anything is computed
    except (TypeError, ValueError):  # an exponent that is not a finite number, e.g. 1/0
        raise NotEvaluable("an exponent is not a finite number") from None
    if too_big:
        raise NotEvaluable("powers too large to evaluate")
    return expr


def _complex(expr: sympy.Expr, subs: dict) -> complex | None:
    try:
        value = complex(expr.evalf(30, subs=subs))
    except Exception:  # evalf of arbitrary input: TypeError on zoo/nan, PrecisionExhausted, Overflow...
        return None
    return value if cmath.isfinite(value) else None


def same_value(a: str, b: str, rel_tol: float = 1e-6) -> bool:
    """Whether two normalised answers evaluate equal (at POINTS when they have variables)."""
    if max(len(a), len(b)) > MAX_CHARS:
        return False
    try:
        ea, eb = to_sympy(a), to_sympy(b)
    except (NotEvaluable, RecursionError):  # RecursionError: braces nested hundreds deep
        return False
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    if {str(s) for s in ea.free_symbols} != {str(s) for s in eb.free_symbols}:
        return False
    for point in POINTS[:3 if symbols else 1]:
        subs = {s: point[k % 2] + 0.1 * k for k, s in enumerate(symbols)}
        va, vb = _complex(ea, subs), _complex(eb, subs)
        if va is None or vb is None or abs(va - vb) > rel_tol * max(1.0, abs(vb)):
            return False
    return True
