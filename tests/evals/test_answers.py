"""Numeric answer extraction: adversarial completions, exact values, and every real GSM8K gold answer."""
from __future__ import annotations

from fractions import Fraction

import pytest

from scalelab.evals.answers import (
    extract_number, format_number, gsm8k_gold, last_boxed, numbers_in, parse_number,
)
from scalelab.evals.tasks import get_task, read_records

F = Fraction

EXTRACTION = [
    # (completion, value, method)
    ("16 - 3 - 4 = 9 eggs. 9 * 2 = $18 a day.\n#### 18", F(18), "####"),
    ("She pays 3 * 5 = 15.\n####$1,000", F(1000), "####"),
    ("#### 18 dollars, since 9 * 2 = 18", F(18), "####"),
    ("#### 5\n\nThe answer is 7", F(5), "####"),  # the GSM8K marker outranks later prose
    ("\\boxed{12} ... but wait\n#### 13", F(13), "####"),
    ("So the total is $\\boxed{\\frac{3}{4}}$.", F(3, 4), "boxed"),
    ("Thus \\boxed{1{,}000}.", F(1000), "boxed"),
    ("The answer is \\dfrac34 of a pie", F(3, 4), "answer-is"),
    ("The final answer is 42. Check: 42 / 2 = 21", F(42), "answer-is"),
    ("Answer: 1,234,567", F(1234567), "answer-is"),
    ("The answer is: -3", F(-3), "answer-is"),
    ("We get 12, then 15, and finally 20 apples.", F(20), "last-number"),
    ("In total she pays $18.00", F(18), "last-number"),
    ("so x = -3", F(-3), "last-number"),
    ("so x = −7", F(-7), "last-number"),  # Unicode minus
    ("The difference is 5-3", F(3), "last-number"),  # a binary minus is not a sign
    ("It grew by 50%", F(50), "last-number"),
    ("She ate 3/4 of it.", F(3, 4), "last-number"),
    ("That is 0.5 or .5 either way", F(1, 2), "last-number"),
    ("Version v2 of model x3 says 7", F(7), "last-number"),  # digits glued to letters are not numbers
    ("no numbers here", None, "none"),
    ("", None, "none"),
]


@pytest.mark.parametrize("text,value,method", EXTRACTION, ids=[t[:30] for t, _, _ in EXTRACTION])
def test_extract_number(text, value, method):
    got = extract_number(text)
    assert (got.value, got.method) == (value, method)


def test_a_marker_without_a_number_falls_through_to_the_next_rule():
    got = extract_number("The answer is below.\n\\boxed{x} hmm, 14 in the end")
    assert (got.value, got.method) == (F(14), "last-number")


@pytest.mark.parametrize("text,value", [
    ("$18", F(18)), ("18 dollars", F(18)), ("18.00", F(18)), ("1,000", F(1000)), ("-5", F(-5)),
    ("3/4", F(3, 4)), ("\\frac{1}{8}", F(1, 8)), ("18.", F(18)), ("75%", F(75)), (" 7 ", F(7)),
    ("18 or 19", None), ("abc", None), ("1/0", None), ("", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_numbers_in_reports_text_and_value_in_order():
    assert numbers_in("from -2 to $3,500.50 then 1/3") == [("-2", F(-2)), ("$3,500.50", F(7001, 2)),
                                                           ("1/3", F(1, 3))]


@pytest.mark.parametrize("value,text", [(F(18), "18"), (F(-5, 2), "-2.5"), (F(1, 3), "1/3"),
                                        (F(1, 8), "0.125"), (F(0), "0")])
def test_format_number(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize("text,inner", [
    ("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\fbox{7}", "7"), ("\\boxed 5 and more", "5"), ("\\boxed {3}", "3"),
    ("\\boxed{\\frac{1}{2}", None), ("nothing", None),
])
def test_last_boxed(text, inner):
    assert last_boxed(text) == inner


def test_gsm8k_gold_requires_the_marker():
    assert gsm8k_gold("so 2 + 2 = 4\n#### 4") == 4
    assert gsm8k_gold("#### 1,200") == 1200
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("the answer is 4")


@pytest.mark.parametrize("split,rows,commas", [("train", 7473, 79), ("test", 1319, 14)])
def test_every_real_gsm8k_gold_answer_parses(shared_data, split, rows, commas):
    records = read_records(shared_data / "gsm8k" / f"{split}.jsonl")
    golds = [gsm8k_gold(r["answer"]) for r in records]  # raises on any row without '#### <number>'
    assert len(golds) == rows and all(g.denominator == 1 for g in golds)
    # thousands separators occur in real gold answers: the parser must handle them, not just tolerate
    assert sum("," in r["answer"].split("####")[-1] for r in records) == commas


ADVERSARIAL_GSM8K = [  # gold for the first test question (Janet's ducks) is 18
    ("Janet has 16 - 3 - 4 = 9 eggs left. 9 * 2 = 18.\n#### 18", True),
    ("She makes $18 every day.", True),
    ("She makes 18 dollars every day at the market, after eating 3 and baking 4.", False),  # last number is 4
    ("The answer is 18.00 dollars, from 16 - 3 - 4 = 9 eggs", True),
    ("\\boxed{18}", True),
    ("#### 18.0", True),
    ("16 eggs minus 7 is 9, times $2 is 18", True),
    ("#### 9\nShe sells 9 eggs for 18 dollars", False),  # the marker commits to 9
    ("I cannot tell.", False),
]


@pytest.mark.parametrize("completion,correct", ADVERSARIAL_GSM8K, ids=[c[:30] for c, _ in ADVERSARIAL_GSM8K])
def test_gsm8k_scoring_on_adversarial_completions(shared_data, completion, correct):
    task = get_task("gsm8k")
    ex = task.load("test", source=str(shared_data / "gsm8k"), limit=1)[0]
    assert ex.answer == "18"
    assert task.score(ex, completion).correct is correct
