"""MATH answer equivalence: LaTeX variants, sequences, safety against hostile answers, and the real
MATH-500 answers (self-equivalence, agreement with the solutions' boxed answers, robustness to rewrites)."""
from __future__ import annotations

import json
import random
import re
import time

import pytest

from scalelab.evals.answers import last_boxed
from scalelab.evals.mathexpr import NotEvaluable, to_sympy
from scalelab.evals.mathnorm import extract_math_answer, is_equiv, normalize_answer, split_top_level
from scalelab.evals.tasks import get_task

EQUIVALENT = [
    ("\\frac{1}{2}", "\\dfrac{1}{2}"), ("\\tfrac12", "\\frac{1}{2}"), ("0.5", "\\frac12"), ("1/2", "0.5"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"), ("3 ", "3"), ("3.", "3"), ("$3$", "3"),
    ("\\text{5 cm}", "5 cm"), ("5.4 \\text{ cents}", "5.4"), ("864 \\mbox{ inches}^2", "864"), ("18 dollars", "18"),
    ("90^\\circ", "90"), ("90^{\\circ}", "90°"), ("x = 3", "3"), ("f(x) = 2x", "2x"), ("x \\in [2, 5)", "[2,5)"),
    ("\\sqrt2", "\\sqrt{2}"), ("2\\sqrt{3}", "\\sqrt{12}"), ("\\frac{\\sqrt{21}}{5}", "\\sqrt{21}/5"),
    ("10,080", "10080"), ("10,\\!080", "10080"), ("\\$32,\\!348", "32348"), (".35625", "0.35625"),
    ("2.50", "2.5"), ("1\\frac{4}{5}", "9/5"), ("137 \\frac{1}{2}", "137.5"), ("50\\%", "50"),
    ("1, -2", "-2, 1"), ("\\{1,2,3\\}", "\\{3,1,2\\}"), ("3 \\pm 2\\sqrt2", "3-2\\sqrt{2}, 3+2\\sqrt{2}"),
    ("(1,2] \\cup (3,4)", "(3,4)\\cup(1,2]"), ("(-\\infty, 0]", "(-\\infty,0]"),
    ("2(x+1)", "2x+2"), ("x^2+2x+1", "(x+1)^2"), ("6 - 5i", "-5i+6"), ("e^{2}", "e^2"),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}"), ("2^{10}", "1024"), ("\\dbinom{5}{2}", "10"), ("\\pi r^2", "r^2\\pi"),
    ("\\text{(C)}", "C"), ("(C)", "C"), ("\\text{East}", "east"), ("\\boxed{7}", "7"),
    ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "(0.2, -3.6)"),
]

NOT_EQUIVALENT = [
    ("5", "6"), ("\\frac{1}{3}", "0.33"), ("(1,2)", "(2,1)"), ("(1,2]", "[1,2)"), ("[1,2]", "1,2"),
    ("x^2", "x^3"), ("2x", "2y"), ("\\sqrt{x^2}", "x"), ("1,2", "1,2,3"), ("\\{1,2\\}", "\\{1,1,2\\}"),
    ("", "0"), ("east", "west"), ("3\\sqrt{2}", "3\\sqrt{3}"), ("10", "1,0"),
]


@pytest.mark.parametrize("a,b", EQUIVALENT, ids=[f"{a}={b}" for a, b in EQUIVALENT])
def test_equivalent_in_both_directions(a, b):
    assert is_equiv(a, b) and is_equiv(b, a)


@pytest.mark.parametrize("a,b", NOT_EQUIVALENT, ids=[f"{a}!={b}" for a, b in NOT_EQUIVALENT])
def test_not_equivalent(a, b):
    assert not is_equiv(a, b) and not is_equiv(b, a)


def test_no_prediction_is_never_equivalent():
    assert not is_equiv(None, "3")


@pytest.mark.parametrize("raw,normal", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"), ("\\dfrac{17}{50}", "\\frac{17}{50}"),
    ("\\frac 59", "\\frac{5}{9}"), ("11\\sqrt2", "11\\sqrt{2}"), ("10,\\!080", "10080"), ("\\text{(E)}", "E"),
    ("y = 2x + 3", "2x+3"), ("\\cot x", "\\cot x"), ("-1/3", "-\\frac{1}{3}"),
])
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_split_top_level_respects_brackets():
    assert split_top_level("(1,2),\\{3,4\\},5") == ["(1,2)", "\\{3,4\\}", "5"]


@pytest.mark.parametrize("hostile", ["9^9^9^9", "(10^{100})^{100}", "x^{x^{x}}", "2^{100000}",
                                     "{" * 600 + "1" + "}" * 600, "1" * 5000])
def test_hostile_answers_are_refused_quickly(hostile):
    start = time.perf_counter()
    assert not is_equiv(hostile, "1")
    assert time.perf_counter() - start < 2.0


FUZZ_TOKENS = ["\\frac", "\\sqrt", "{", "}", "^", "_", "(", ")", "[", "]", "\\{", "\\}", ",", "1", "0", "9", "x",
               "i", "\\pi", "\\pm", "\\cup", "\\infty", "-", "/", "=", "\\text{", " ", ".", "$", "\\boxed{",
               "\\left(", "\\right)", "\\sin", "\\dfrac", "%", "^\\circ", "\\begin{pmatrix}", "\\\\", "&", "!", "__"]


def test_random_latex_soup_never_raises_and_stays_fast():
    rng = random.Random(0)
    for _ in range(400):
        a = "".join(rng.choice(FUZZ_TOKENS) for _ in range(rng.randint(1, 14)))
        b = "".join(rng.choice(FUZZ_TOKENS) for _ in range(rng.randint(1, 6)))
        start = time.perf_counter()
        assert isinstance(is_equiv(a, b), bool) and isinstance(is_equiv(a, a), bool), (a, b)
        extract_math_answer(a)
        assert time.perf_counter() - start < 1.0, (a, b)


@pytest.mark.parametrize("code", ["__import__('os').system('echo pwned')", "().__class__.__bases__",
                                  "lambda: 1", "'a' * 3", "x.real", "[1, 2]"])
def test_python_never_reaches_the_expression_parser(code, capfd):
    with pytest.raises(NotEvaluable):
        to_sympy(code)
    assert not is_equiv(code, "0")
    assert "pwned" not in capfd.readouterr().out


@pytest.mark.parametrize("completion,answer,method", [
    ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", "boxed"),
    ("Therefore\n#### 12", "12", "####"),
    ("The final answer is $(1, 2)$.", "$(1, 2)$", "answer-is"),
    ("we end up with 7 marbles", "7", "last-number"),
    ("no idea", None, "none"),
])
def test_extract_math_answer(completion, answer, method):
    assert extract_math_answer(completion) == (answer, method)


# ---------------------------------------------------------------------------------------------
# the real MATH-500 answers


@pytest.fixture(scope="module")
def math500_rows(shared_data):
    with open(shared_data / "math500" / "test.jsonl") as f:
        return [json.loads(line) for line in f]


def test_every_math500_answer_is_self_equivalent(math500_rows):
    assert len(math500_rows) == 500
    assert all(is_equiv(r["answer"], r["answer"]) for r in math500_rows)


def test_math500_answers_match_the_boxed_answer_of_their_solution(math500_rows):
    matched = sum(is_equiv(last_boxed(r["solution"]), r["answer"]) for r in math500_rows)
    share = matched / len(math500_rows)
    assert share >= 0.99, f"only {share:.1%} of answers match their solution's \\boxed{{}}"  # measured: 100%


def rewrites(answer: str) -> list[str]:
    """Ways a model may write the same answer: math delimiters, \\dfrac, boxed, trailing period, spacing,
    and for integers "x = n", "n.0", \\text{n}."""
    out = [f"${answer}$", answer.replace("\\frac", "\\dfrac"), f"\\boxed{{{answer}}}", answer + ".",
           answer.replace(",", ", ")]
    if re.fullmatch(r"-?\d+", answer):
        out += [f"x = {answer}", f"{answer}.0", f"\\text{{{answer}}}"]
    return out


def test_math500_answers_survive_meaning_preserving_rewrites(math500_rows):
    pairs = [(v, r["answer"]) for r in math500_rows for v in rewrites(r["answer"])]
    share = sum(is_equiv(v, a) for v, a in pairs) / len(pairs)
    assert share >= 0.99, f"{share:.2%} of {len(pairs)} rewrites judged equivalent"  # measured: 100%


def test_off_by_one_integer_answers_are_rejected(math500_rows):
    integers = [r["answer"] for r in math500_rows if re.fullmatch(r"-?\d+", r["answer"])]
    assert len(integers) > 250
    assert not any(is_equiv(str(int(a) + 1), a) for a in integers)


def test_math500_task_scores_its_own_solutions(shared_data):
    task = get_task("math500")
    examples = task.load("test", source=str(shared_data / "math500"), limit=50)
    scores = [task.score(ex, ex.meta["solution"]) for ex in examples]
    assert all(s.correct for s in scores), [s.reason for s in scores if not s.correct]
    assert not task.score(examples[0], "I think it is \\boxed{42}").correct
