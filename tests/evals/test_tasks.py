"""The task registry, loaders (real local files, the hub path with a stand-in client, bad input), held-out
splits, the arithmetic generator and curriculum, prompt formats, and scorers that never raise."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from scalelab.evals import arithmetic, codetasks, mathtasks
from scalelab.evals.arithmetic import CURRICULUM, ArithmeticSpec, curriculum_examples, evaluate
from scalelab.evals.prompts import FORMATS
from scalelab.evals.tasks import (
    DataError, Example, Score, get_task, in_holdout, read_records, resolve_source, score_example, task_names,
)

BUILTIN = {"gsm8k", "math500", "humaneval", "mbpp", "arithmetic", "toolcall_schema", "toolcall_args", "ifeval_lite"}


def test_registry_lists_every_builtin_task():
    assert BUILTIN <= set(task_names())


def test_unknown_task_names_the_registered_ones():
    with pytest.raises(KeyError, match="registered tasks: .*gsm8k"):
        get_task("gsm9k")


@pytest.mark.parametrize("name,options,match", [
    ("gsm8k", {"prompt_format": "haiku"}, "allowed"), ("math500", {"prompt_format": "cot_hash"}, "allowed"),
    ("arithmetic", {"digits": 0}, "digits"), ("arithmetic", {"operations": "/"}, "operations"),
    ("mbpp", {"variant": "tiny"}, "variant"), ("ifeval_lite", {"max_constraints": 0}, "max_constraints"),
])
def test_bad_task_options_are_refused(name, options, match):
    with pytest.raises(ValueError, match=match):
        get_task(name, **options)


def test_unknown_split_names_the_splits():
    with pytest.raises(DataError, match="its splits: test"):
        get_task("humaneval").load("train")


# ---------------------------------------------------------------------------------------------
# real data, local files


def test_gsm8k_loads_both_splits_from_the_shared_folder(shared_data):
    task = get_task("gsm8k")
    test = task.load("test", source=str(shared_data / "gsm8k"))
    train = task.load("train", source=str(shared_data / "gsm8k"), limit=3)
    assert len(test) == 1319 and len(train) == 3
    ex = test[0]
    assert (ex.task, ex.id, ex.answer) == ("gsm8k", "gsm8k/test/0", "18")
    assert ex.prompt[0]["role"] == "user" and ex.prompt[0]["content"].startswith("Janet")
    assert ex.prompt[0]["content"].endswith(FORMATS["cot_hash"].instruction)
    assert {e.prompt[0]["content"] for e in train}.isdisjoint(e.prompt[0]["content"] for e in test)


def test_a_single_file_is_a_source_too(shared_data):
    examples = get_task("gsm8k", prompt_format="answer_only").load(
        "test", source=str(shared_data / "gsm8k" / "test.jsonl"), limit=2)
    assert [e.answer for e in examples] == ["18", "3"]
    assert examples[0].prompt[0]["content"].endswith("Answer with only the number.")


def test_math500_test_and_math_train_are_disjoint(shared_data):
    task = get_task("math500")
    test = task.load("test", source=str(shared_data / "math500"))
    with pytest.warns(UserWarning) as caught:
        train = task.load("train", source=str(shared_data / "math"))
    # only the loader's own warnings: a worker running the whole suite recorded an unrelated one in this window
    # once (which one is not known; its text did not match)
    found = [re.search(r"(\w+\.jsonl: line \d+): skipped", str(w.message)) for w in caught
             if issubclass(w.category, UserWarning) and "skipped" in str(w.message)]
    skipped = sorted(m.group(1) for m in found if m)
    assert len(skipped) == len(found), [str(w.message) for w in caught]
    assert skipped == ["number_theory.jsonl: line 850", "number_theory.jsonl: line 852"]  # empty \boxed{}
    assert len(test) == 500 and len(train) == 7498
    assert test[0].id == "test/precalculus/807.json" and test[0].meta["level"] == 2
    assert {e.prompt[0]["content"] for e in test}.isdisjoint(e.prompt[0]["content"] for e in train)
    assert all(e.answer for e in train)  # train answers come from the solutions' \boxed{}


def test_humaneval_and_mbpp_load(shared_data):
    he = get_task("humaneval").load("test", source=str(shared_data / "humaneval"))
    assert [e.id for e in he[:2]] == ["HumanEval/0", "HumanEval/1"] and len(he) == 164
    assert he[0].meta["entry_point"] == "has_close_elements"
    sizes = {s: len(get_task("mbpp").load(s, source=str(shared_data / "mbpp"))) for s in codetasks.MBPP_SPLITS}
    assert sizes == {"prompt": 10, "test": 500, "validation": 90, "train": 374}
    sanitized = sum(len(get_task("mbpp", variant="sanitized").load(s, source=str(shared_data / "mbpp")))
                    for s in codetasks.MBPP_SPLITS)
    assert sanitized == 427


def test_mbpp_entry_points_are_what_the_tests_call(shared_data):
    examples = get_task("mbpp").load("test", source=str(shared_data / "mbpp"))
    for ex in examples:
        assert re.search(rf"\b{ex.meta['entry_point']}\s*\(", " ".join(ex.meta["tests"])), ex.id


def test_mbpp_reference_solutions_pass_and_wrong_ones_fail(shared_data):
    task = get_task("mbpp")
    examples = task.load("test", source=str(shared_data / "mbpp"), limit=3)
    assert all(task.score(ex, f"```python\n{ex.answer}\n```").correct for ex in examples)
    wrong = f"```python\ndef {examples[0].meta['entry_point']}(*args):\n    return None\n```"
    assert not task.score(examples[0], wrong).correct


# ---------------------------------------------------------------------------------------------
# sources: hub ids, missing and malformed files


def test_source_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_SHARED_DATA", str(tmp_path))
    assert resolve_source("", "gsm8k", "openai/gsm8k").kind == "hub"  # no local copy: the hub id
    (tmp_path / "gsm8k").mkdir()
    assert resolve_source("", "gsm8k", "openai/gsm8k").where == str(tmp_path / "gsm8k")
    assert resolve_source("someone/their-gsm8k", "gsm8k", "openai/gsm8k").where == "someone/their-gsm8k"
    with pytest.raises(DataError, match="no such file"):
        resolve_source(str(tmp_path / "missing.jsonl"), "gsm8k", "openai/gsm8k")


def test_hub_ids_go_through_the_hub_client(monkeypatch):
    calls = []

    def fake_hub(hub_id, split, config=None):
        calls.append((hub_id, split, config))
        return [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}]

    monkeypatch.setattr(mathtasks, "hub_records", fake_hub)
    examples = get_task("gsm8k").load("train", source="openai/gsm8k")
    assert calls == [("openai/gsm8k", "train", "main")]
    assert examples[0].answer == "4" and examples[0].id == "gsm8k/train/0"


def test_malformed_rows_name_the_file_and_line(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl: invalid JSON at line 2"):
        read_records(bad_json)
    no_marker = tmp_path / "nomark.jsonl"
    no_marker.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "it is 2"}\n')
    with pytest.raises(DataError, match=r"nomark.jsonl: line 2: no '#### <number>'"):
        get_task("gsm8k").load("test", source=str(no_marker))
    missing_field = tmp_path / "nofield.jsonl"
    missing_field.write_text('{"question": "q"}\n')
    with pytest.raises(DataError, match=r"nofield.jsonl: line 1: missing field\(s\) answer"):
        get_task("gsm8k").load("test", source=str(missing_field))


def test_gzip_jsonl_and_json_lists_are_read(tmp_path):
    gz = tmp_path / "rows.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"a": 1}\n\n{"a": 2}\n')
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps([{"a": 3}]))
    assert read_records(gz) == [{"a": 1}, {"a": 2}] and read_records(listed) == [{"a": 3}]
    listed.write_text(json.dumps({"a": 3}))
    with pytest.raises(DataError, match="list of objects"):
        read_records(listed)


# ---------------------------------------------------------------------------------------------
# arithmetic


@pytest.mark.parametrize("numbers,ops,value", [([2, 3, 4], ["+", "*"], 14), ([2, 3, 4], ["*", "-"], 2),
                                               ([10, 2, 3, 4], ["-", "*", "+"], 8), ([5, 7], ["-"], -2)])
def test_evaluate_uses_operator_precedence(numbers, ops, value):
    assert evaluate(numbers, ops) == value


def question_expression(example: Example) -> str:
    return re.search(r"What is (.+)\?", example.prompt[0]["content"]).group(1)


def test_arithmetic_is_seeded_correct_and_honours_the_knobs():
    task = get_task("arithmetic", digits=3, operations="+-*", terms=4)
    a, b = task.load("train", limit=200, seed=1), task.load("train", limit=200, seed=1)
    assert a == b and a != task.load("train", limit=200, seed=2)
    for ex in a:
        expr = question_expression(ex)
        assert int(ex.answer) == eval(expr)  # our own generated "d op d op ..." string
        operands = re.findall(r"\d+", expr)
        assert len(operands) == 4 and all(len(x) == 3 for x in operands)
    assert any(int(ex.answer) < 0 for ex in a)  # negatives occur, so extraction of signs matters


def test_arithmetic_train_and_test_are_disjoint_by_content():
    task = get_task("arithmetic", digits=2, operations="+-", terms=2)
    train = {question_expression(e) for e in task.load("train", limit=3000)}
    test = {question_expression(e) for e in task.load("test", limit=500)}
    assert train.isdisjoint(test)
    assert all(in_holdout(q) for q in test) and not any(in_holdout(q) for q in train)


def test_the_default_arithmetic_task_needs_no_data():
    examples = get_task("arithmetic").load("train")
    assert len(examples) == arithmetic.Arithmetic.default_size
    assert examples[0].prompt[0]["content"].endswith("Answer with only the number.")


def test_curriculum_goes_from_easy_to_harder():
    assert CURRICULUM[0] == ArithmeticSpec(1, "+", 2)
    sizes = [10 ** s.digits * len(s.operations) * s.terms for s in CURRICULUM]
    assert sizes == sorted(sizes)
    examples = curriculum_examples(per_level=5, seed=3)
    assert len(examples) == 5 * len(CURRICULUM)
    digits = [ex.meta["digits"] for ex in examples]
    assert digits == sorted(digits) and all(int(ex.answer) < 19 for ex in examples[:5])


# ---------------------------------------------------------------------------------------------
# formats and robustness of every scorer


@pytest.mark.parametrize("fmt,completion,ok", [
    ("answer_only", "18", True), ("answer_only", " $18 ", True), ("answer_only", "It is 18", False),
    ("answer_only", "18\n19", False), ("cot_hash", "9 * 2 = 18\n#### 18", True),
    ("cot_hash", "#### 18\nbecause", False), ("cot_hash", "#### 18\n#### 18", False), ("cot_hash", "18", False),
    ("cot_boxed", "so \\boxed{18}.", True), ("cot_boxed", "\\boxed{}", False),
    ("cot_boxed", "\\boxed{1} or \\boxed{2}", False), ("cot_boxed", "\\boxed{18", False),
])
def test_prompt_formats(fmt, completion, ok):
    assert FORMATS[fmt].well_formed(completion) is ok


JUNK = ["", " ", "\x00\x01", "{" * 1000, "#### ", "\\boxed{", "```python\n", "9" * 10_000, "x" * 100_000,
        "\\frac{1}{0}", "#### 1/0", '{"name": 1, "arguments": []}']


@pytest.fixture(scope="module")
def one_example_per_task(shared_data):
    sources = {"gsm8k": shared_data / "gsm8k", "math500": shared_data / "math500",
               "humaneval": shared_data / "humaneval", "mbpp": shared_data / "mbpp"}
    out = []
    for name in sorted(BUILTIN):
        split = "test" if "test" in get_task(name).splits else get_task(name).splits[0]
        out += get_task(name).load(split, source=str(sources.get(name, "")), limit=1)
    return out


def test_no_scorer_raises_on_junk(one_example_per_task):
    for ex in one_example_per_task:
        for junk in JUNK:
            score = score_example(ex, junk)
            assert isinstance(score, Score) and isinstance(score.reason, str)
            # (junk may meet ifeval's constraints, e.g. "no commas": only there may it be correct)
            assert score.correct is False or ex.task == "ifeval_lite", (ex.task, junk[:20], score)
            assert isinstance(get_task(ex.task).check_format(ex, junk), bool)
