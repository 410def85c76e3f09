"""Tool-call and instruction-following tasks: the schema validator, call parsing, per-field scoring,
IFEval-style constraint checkers, and the generators' determinism and held-out splits."""
from __future__ import annotations

import json

import pytest

from scalelab.evals.ifeval import CONSTRAINTS, check
from scalelab.evals.schema import SchemaError, validate
from scalelab.evals.tasks import Example, get_task
from scalelab.evals.toolcall import TOOLS, field_scores, parse_call

# ---------------------------------------------------------------------------------------------
# schema validator

SCHEMA = {"type": "object", "required": ["n", "tags"], "additionalProperties": False, "properties": {
    "n": {"type": "integer", "minimum": 1, "maximum": 9},
    "unit": {"type": "string", "enum": ["c", "f"]},
    "tags": {"type": "array", "minItems": 1, "items": {"type": "string", "maxLength": 3}},
    "price": {"type": ["number", "null"]}}}


@pytest.mark.parametrize("value,errors", [
    ({"n": 3, "tags": ["a"]}, []),
    ({"n": 3.0, "tags": ["a"], "price": None}, []),  # 3.0 is an integer in JSON Schema
    ({"n": True, "tags": ["a"]}, ["$.n: expected integer, got bool True"]),  # a boolean is not a number
    ({"n": 0, "tags": ["a"]}, ["$.n: 0 is below the minimum 1"]),
    ({"n": 10, "tags": ["a"]}, ["$.n: 10 is above the maximum 9"]),
    ({"tags": ["a"]}, ["$: missing required property 'n'"]),
    ({"n": 1, "tags": []}, ["$.tags: 0 items, fewer than 1"]),
    ({"n": 1, "tags": ["a", "long"]}, ["$.tags[1]: 4 characters, more than 3"]),
    ({"n": 1, "tags": ["a"], "unit": "k"}, ["$.unit: 'k' is not one of ['c', 'f']"]),
    ({"n": 1, "tags": ["a"], "extra": 1}, ["$: unexpected property 'extra'"]),
    ({"n": 1, "tags": ["a"], "price": "3"}, ["$.price: expected number or null, got str '3'"]),
    ([1], ["$: expected object, got list [1]"]),
])
def test_validate(value, errors):
    assert validate(value, SCHEMA) == errors


def test_unsupported_schema_keywords_are_refused_not_ignored():
    with pytest.raises(SchemaError, match="pattern"):
        validate("x", {"type": "string", "pattern": "^a"})


def test_every_tool_schema_accepts_its_own_sampled_arguments():
    import numpy as np
    rng = np.random.default_rng(0)
    for tool in TOOLS.values():
        for _ in range(50):
            assert validate(tool.sample(rng), tool.parameters) == [], tool.name


# ---------------------------------------------------------------------------------------------
# parsing calls


@pytest.mark.parametrize("completion,call", [
    ('{"name": "f", "arguments": {"a": 1}}', {"name": "f", "arguments": {"a": 1}}),
    ('Sure!\n```json\n{"name": "f", "arguments": {}}\n```', {"name": "f", "arguments": {}}),
    ('I will call {"name": "f", "arguments": {"s": "}{"}} now.', {"name": "f", "arguments": {"s": "}{"}}),
    ("{not json} then {\"a\": 2}", {"a": 2}),
    ("no json at all", None), ("[1, 2]", None),
])
def test_parse_call(completion, call):
    assert parse_call(completion) == call


# ---------------------------------------------------------------------------------------------
# toolcall_schema


def test_gold_calls_are_valid_and_generation_is_seeded():
    task = get_task("toolcall_schema")
    examples = task.load("train", limit=60, seed=4)
    assert examples == task.load("train", limit=60, seed=4)
    assert {ex.meta["tool"] for ex in examples} == set(TOOLS)
    for ex in examples:
        assert task.score(ex, ex.answer).correct, ex.id
        assert ex.meta["tool"] in ex.meta["offered"] and len(set(ex.meta["offered"])) == 3


def test_schema_task_rejects_wrong_function_and_invalid_arguments():
    task = get_task("toolcall_schema")
    ex = next(e for e in task.load("test", limit=20) if e.meta["tool"] == "book_flight")
    gold = json.loads(ex.answer)
    other = next(t for t in ex.meta["offered"] if t != "book_flight")
    assert "wrong function" in task.score(ex, json.dumps({"name": other, "arguments": gold["arguments"]})).reason
    bad = dict(gold["arguments"], passengers="two", origin="Paris")
    score = task.score(ex, json.dumps({"name": "book_flight", "arguments": bad}))
    assert not score.correct
    assert "$.arguments.origin: 5 characters, more than 3" in score.reason
    assert "$.arguments.passengers: expected integer" in score.reason
    assert task.score(ex, "I would book it.").reason == "no JSON object in the completion"


def test_tool_requests_are_disjoint_between_splits():
    for name in ("toolcall_schema", "toolcall_args"):
        task = get_task(name)
        train = {e.prompt[0]["content"] for e in task.load("train", limit=300)}
        test = {e.prompt[0]["content"] for e in task.load("test", limit=100)}
        assert train.isdisjoint(test)


# ---------------------------------------------------------------------------------------------
# toolcall_args


def test_field_scores_by_hand():
    gold = {"city": "Oslo", "days": 3, "repeat": ["monday", "friday"], "in_stock": True}
    assert field_scores(dict(gold), gold) == (4, 4, [])
    pred = {"city": " oslo ", "days": 3.0, "repeat": ["friday", "monday"], "in_stock": True}
    assert field_scores(pred, gold) == (4, 4, [])  # case, spacing, 3 == 3.0, list order do not matter
    pred = {"city": "Oslo", "days": "3", "repeat": ["monday"], "extra": 1}
    right, counted, problems = field_scores(pred, gold)
    assert (right, counted) == (1, 5)  # city right; days (a string), repeat, in_stock (missing), extra wrong
    assert problems[-1] == "extra: not an argument"
    assert field_scores({"in_stock": 1}, {"in_stock": True})[0] == 0  # 1 is not true


def test_args_task_gives_partial_credit_per_field():
    task = get_task("toolcall_args")
    ex = next(e for e in task.load("train", limit=10) if e.meta["tool"] == "get_weather")
    gold = json.loads(ex.answer)
    full = task.score(ex, ex.answer)
    assert full.correct and full.partial == 1.0
    wrong_days = dict(gold["arguments"], days=gold["arguments"]["days"] % 7 + 1)
    score = task.score(ex, json.dumps({"name": "get_weather", "arguments": wrong_days}))
    assert not score.correct and score.partial == pytest.approx(2 / 3) and score.reason.startswith("2/3")
    wrong_name = task.score(ex, json.dumps({"name": "weather", "arguments": gold["arguments"]}))
    assert not wrong_name.correct and wrong_name.partial == 1.0
    assert task.score(ex, "nothing").partial == 0.0


# ---------------------------------------------------------------------------------------------
# ifeval


@pytest.mark.parametrize("spec,text,ok", [
    ({"kind": "bullets", "n": 3}, "Intro\n- a\n- b\n* c", True),
    ({"kind": "bullets", "n": 3}, "- a\n- b", False),
    ({"kind": "bullets", "n": 2}, "1. a\n2) b\n-not a bullet", True),
    ({"kind": "include_word", "word": "orbit"}, "The Orbit was low.", True),
    ({"kind": "include_word", "word": "orbit"}, "An orbital path.", False),  # whole words only
    ({"kind": "avoid_word", "word": "very"}, "Every day.", True),
    ({"kind": "avoid_word", "word": "very"}, "Very good.", False),
    ({"kind": "max_words", "n": 5}, "one two three four five", True),
    ({"kind": "max_words", "n": 5}, "one two three four five six", False),
    ({"kind": "max_words", "n": 5}, "   ", False),
    ({"kind": "end_with", "phrase": "until next time."}, "Bye, until next time.\n", True),
    ({"kind": "end_with", "phrase": "until next time."}, "until next time. PS", False),
    ({"kind": "no_commas"}, "a b c", True), ({"kind": "no_commas"}, "a, b", False),
    ({"kind": "lowercase"}, "all small here.", True), ({"kind": "lowercase"}, "Not here.", False),
    ({"kind": "title"}, "<<Tide Pools>>\ntext", True), ({"kind": "title"}, "<<>> text", False),
])
def test_constraint_checkers(spec, text, ok):
    assert check(text, spec) is ok


def test_ifeval_scores_the_share_of_constraints_met():
    specs = [{"kind": "bullets", "n": 2}, {"kind": "no_commas"}, {"kind": "include_word", "word": "maple"}]
    ex = Example("ifeval_lite", "hand", [{"role": "user", "content": "..."}], json.dumps(specs), {"constraints": specs})
    task = get_task("ifeval_lite")
    assert task.score(ex, "- maple syrup\n- pancakes").correct
    score = task.score(ex, "- syrup, pancakes\n- more")
    assert not score.correct and score.partial == pytest.approx(1 / 3)
    assert score.reason == "1/3 constraints met; failed: no_commas, include_word"


def test_ifeval_generation():
    task = get_task("ifeval_lite", max_constraints=2)
    examples = task.load("train", limit=200, seed=1)
    assert examples == task.load("train", limit=200, seed=1)
    counts = {len(e.meta["constraints"]) for e in examples}
    assert counts == {1, 2}
    kinds = {s["kind"] for e in examples for s in e.meta["constraints"]}
    assert kinds == set(CONSTRAINTS)
    for ex in examples[:20]:  # the instruction text states every constraint
        for spec in ex.meta["constraints"]:
            assert CONSTRAINTS[spec["kind"]].describe({k: v for k, v in spec.items() if k != "kind"}) \
                in ex.prompt[0]["content"]
