"""The reference GSM8K protocol: Qwen's boxed-answer system prompt, strict (the box) and lenient (box, else the
last number) scoring, checked on hand-written completions and on the real GSM8K test file."""
from scalelab.evals.mathtasks import extract_reference, strict_correct
from scalelab.evals.tasks import Example, get_task

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def ex(answer: str = "18", fmt: str = "qwen_boxed") -> Example:
    return Example("gsm8k", "t/0", [], answer, {"prompt_format": fmt})


def verdicts(completion: str, answer: str = "18") -> tuple[bool, bool]:
    e = ex(answer)
    return strict_correct(e, completion), get_task("gsm8k", prompt_format="qwen_boxed").score(e, completion).correct


def test_boxed_answer_is_strict_and_lenient():
    assert verdicts("3 * 6 = 18 eggs, so she has \\boxed{18}.") == (True, True)
    assert verdicts("\\boxed{\\$18.00}") == (True, True)


def test_unboxed_answer_counts_only_lenient():
    assert verdicts("She sells 16 - 3 - 4 = 9 eggs for 9 * 2 = 18 dollars.") == (False, True)
    # '####' is not the asked-for marker here: strict refuses it; lenient reads the last number, 18
    assert verdicts("#### 18") == (False, True)


def test_the_box_wins_over_a_later_number():
    assert verdicts("\\boxed{17}. Check: 17 + 1 = 18") == (False, False)
    # the last box counts: a corrected answer is read
    assert verdicts("first \\boxed{17}, no: \\boxed{18}") == (True, True)


def test_an_empty_or_numberless_box_falls_back_to_the_last_number():
    got = extract_reference("so 2 + 16 = 18, \\boxed{eighteen}")
    assert (got.value, got.method) == (18, "last-number")
    assert verdicts("so 2 + 16 = 18, \\boxed{eighteen}") == (False, True)


def test_strict_reads_the_hash_line_under_the_hash_format():
    e = ex(fmt="cot_hash")
    assert strict_correct(e, "9 * 2 = 18\n#### 18")
    assert not strict_correct(e, "9 * 2 = 18\n\\boxed{18}")


def test_gsm8k_reference_prompt_is_system_then_question(shared_data):
    rows = get_task("gsm8k", prompt_format="qwen_boxed").load("test", str(shared_data / "gsm8k"), limit=2)
    first = rows[0].prompt
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0]["content"] == SYSTEM
    assert first[1]["content"].startswith("Janet") and first[1]["content"].endswith("farmers' market?")
    assert rows[0].answer == "18"


def test_math500_accepts_the_reference_prompt(shared_data):
    rows = get_task("math500", prompt_format="qwen_boxed").load("test", str(shared_data / "math500"), limit=1)
    assert rows[0].prompt[0] == {"role": "system", "content": SYSTEM}
