"""Reward functions with hand-computed values, the deliberately exploitable variants, the combinator, the
registry and the TRL adapter."""
from __future__ import annotations

import json

import pytest

from scalelab.evals.rewards import (
    REWARDS, combined, completion_text, correctness_reward, example_row, for_trl, format_reward, get_reward,
    length_aware, partial_reward,
)
from scalelab.evals.tasks import Example, get_task


def arithmetic_example(answer: str, prompt_format: str = "cot_hash") -> Example:
    return Example("arithmetic", f"hand/{answer}", [{"role": "user", "content": "What is it?"}], answer,
                   {"prompt_format": prompt_format})


SEVEN = arithmetic_example("7")


def test_correctness_reward():
    completions = ["3 + 4 = 7\n#### 7", "#### 8", "it is seven", "so 7"]
    assert correctness_reward(completions, [SEVEN] * 4) == [1.0, 0.0, 0.0, 1.0]


def test_format_reward_is_independent_of_correctness():
    completions = ["3 + 4 = 7\n#### 7", "#### 8", "so 7", "#### 7\n#### 7"]
    assert format_reward(completions, [SEVEN] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_partial_reward_uses_partial_credit_where_a_task_has_it():
    args_task = get_task("toolcall_args")
    ex = next(e for e in args_task.load("train", limit=10) if e.meta["tool"] == "get_weather")
    gold = json.loads(ex.answer)
    one_wrong = json.dumps({"name": "get_weather", "arguments": dict(gold["arguments"], unit="kelvin")})
    rewards = partial_reward([ex.answer, one_wrong, "#### 7"], [ex, ex, SEVEN])
    assert rewards == pytest.approx([1.0, 2 / 3, 1.0])


def test_length_aware_honest_mode_by_hand():
    reward = length_aware(target_chars=10, penalty=0.5)
    short_right = "#### 7"  # 6 chars: no penalty
    long_right = "x" * 9 + "\n#### 7"  # 16 chars: overshoot 6/10 -> 1 - 0.3
    very_long_wrong = "y" * 100 + "\n#### 8"  # overshoot capped at 1 -> 0 - 0.5
    assert reward([short_right, long_right, very_long_wrong], [SEVEN] * 3) == pytest.approx([1.0, 0.7, -0.5])
    assert reward.__name__ == "length_aware_none"


def test_length_exploit_pays_a_wrong_rambler_more_than_a_right_short_answer():
    reward = length_aware(target_chars=10, penalty=0.0, exploit="length", exploit_weight=1.0)
    right_short, wrong_long = "#### 7", "blah " * 20 + "#### 8"
    got = reward([right_short, wrong_long], [SEVEN, SEVEN])
    assert got == pytest.approx([1.0 + 0.6, 0.0 + 2.0])  # 6/10 of the target; length pay capped at 2
    assert got[1] > got[0]  # the hack works, which is the point of this variant


def test_format_exploit_pays_for_the_marker_whatever_the_number():
    reward = length_aware(target_chars=1000, exploit="format", exploit_weight=2.0)
    assert reward(["#### 0", "seven", "#### 7"], [SEVEN] * 3) == pytest.approx([2.0, 0.0, 3.0])


def test_gate_pays_the_length_term_only_on_a_right_answer():
    reward = length_aware(target_chars=10, penalty=0.0, exploit="length", defense="gate")
    right_short, right_long, wrong_long = "#### 7", "x" * 14 + "\n#### 7", "blah " * 20 + "#### 8"
    # right: 1 + 6/10 and 1 + min(21/10, 2); wrong: 0, however long (ungated it would be 2.0, as above)
    assert reward([right_short, right_long, wrong_long], [SEVEN] * 3) == pytest.approx([1.6, 3.0, 0.0])
    assert reward.__name__ == "length_aware_length_gated"


def test_gate_stops_the_format_exploit_on_wrong_answers():
    reward = length_aware(target_chars=1000, exploit="format", exploit_weight=2.0, defense="gate")
    assert reward(["#### 0", "seven", "#### 7"], [SEVEN] * 3) == pytest.approx([0.0, 0.0, 3.0])


def test_length_aware_rejects_bad_parameters():
    with pytest.raises(ValueError, match="exploit"):
        length_aware(exploit="tokens")
    with pytest.raises(ValueError, match="defense 'cap'"):
        length_aware(defense="cap")
    with pytest.raises(ValueError, match="target_chars"):
        length_aware(target_chars=0)


def test_combined_is_the_weighted_sum():
    reward = combined({"correctness": 1.0, "format": 0.25})
    assert reward(["3 + 4 = 7\n#### 7", "so 7", "#### 8"], [SEVEN] * 3) == pytest.approx([1.25, 1.0, 0.25])
    assert reward.__name__ == "combined_correctness1_format0.25"
    with pytest.raises(KeyError, match="unknown reward"):
        combined({"kindness": 1.0})


def test_registry():
    assert set(REWARDS) == {"correctness", "partial", "format", "format_gated", "length_aware", "combined"}
    assert get_reward("correctness") is correctness_reward
    assert get_reward("length_aware", exploit="length").__name__ == "length_aware_length"


def test_mixed_task_batch():
    ifeval = Example("ifeval_lite", "h", [], "[]", {"constraints": [{"kind": "no_commas"}]})
    call = get_task("toolcall_schema").load("train", limit=1)[0]
    rewards = correctness_reward(["#### 7", "no commas here", call.answer, "a, b"], [SEVEN, ifeval, call, ifeval])
    assert rewards == [1.0, 1.0, 1.0, 0.0]


def test_conversational_completions_are_read_from_the_last_assistant_message():
    conversation = [{"role": "assistant", "content": "#### 8"}, {"role": "user", "content": "sure?"},
                    {"role": "assistant", "content": "#### 7"}]
    assert completion_text(conversation) == "#### 7"
    assert correctness_reward([conversation], [SEVEN]) == [1.0]
    with pytest.raises(TypeError):
        completion_text(7)


def test_batch_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 completions for 1 examples"):
        correctness_reward(["a", "b"], [SEVEN])


def test_trl_adapter_rebuilds_examples_from_dataset_columns():
    examples = get_task("arithmetic").load("test", limit=3, seed=5)
    rows = [example_row(ex) for ex in examples]
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    completions = [[{"role": "assistant", "content": ex.answer}] for ex in examples]
    reward = for_trl(combined({"correctness": 1.0, "format": 0.5}))
    got = reward(prompts=columns.pop("prompt"), completions=completions, completion_ids=None, **columns)
    assert got == [1.5, 1.5, 1.5]  # right answers, in the "answer only" form the prompts ask for
    assert reward.__name__.startswith("combined_")
