"""`scalelab grpo eval RUN --rescore`: the committed runs' held-out results recomputed from their kept generations
on the CPU, and a hand-made run whose recorded verdicts are checked, confirmed and caught when wrong."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scalelab.cli import main as cli
from scalelab.core.jsonio import write_json
from scalelab.grpo.heldout import ExampleResult, PolicyEval, compare, save_eval, save_summary
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.rescore import rescore_run

REPO = Path(__file__).resolve().parents[2]
RUNS = sorted((REPO / "results").glob("*/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-*"))
CONFIG = REPO / "results/h100/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-lr5e-5-s0/config.toml"  # qwen_boxed GSM8K


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parts[-4]}/{p.name}")
def test_every_committed_recipe_run_reproduces_its_reported_summary(run):
    r = rescore_run(run)
    assert r.reproduces, (r.changed, r.differences[:5])
    assert r.summary["n_examples"] == 1319


def test_the_committed_headline_numbers_come_back():
    s = rescore_run(REPO / "results/h100/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-lr5e-5-s0").summary
    assert round(100 * s["greedy_pass1"]["delta"], 1) == 9.4
    assert round(100 * s["greedy_strict_pass1"]["delta"], 1) == 9.6


# answers, then (text, recorded lenient verdict) for base and trained; lenient = the last box, else the last number
ANSWERS = ["18", "3", "70000", "540"]
BASE = [("so \\boxed{18}", True), ("so 4", False), ("the answer is 5", False), ("no answer", False)]
TRAINED = [("\\boxed{18}", True), ("it is \\boxed{3}", True), ("she earns 70000", True), ("\\boxed{541}", False)]


def _policy(name: str, rows: list[tuple[str, bool]]) -> PolicyEval:
    ex = tuple(ExampleResult(f"gsm8k/test/{i}", a, ok, 10, text, 0, 0, ())
               for i, (a, (text, ok)) in enumerate(zip(ANSWERS, rows)))
    return PolicyEval(name, 0 if name == "base" else 5, "k", "test", sum(ok for _, ok in rows) / len(rows), None,
                      None, ex, 1.0)


def _run(tmp_path: Path, trained_rows=TRAINED) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CONFIG, run / "config.toml")
    base, trained = _policy("base", BASE), _policy("trained", trained_rows)
    save_eval(run, base), save_eval(run, trained)
    save_summary(run, compare(base, trained, load_grpo_config(run / "config.toml")))
    return run


def test_a_hand_made_run_is_confirmed_with_the_values_worked_out_by_hand(tmp_path, capsys):
    r = rescore_run(_run(tmp_path))
    assert r.reproduces and r.changed == {"base": 0, "trained": 0}
    g, strict = r.summary["greedy_pass1"], r.summary["greedy_strict_pass1"]
    assert (g["base"], g["trained"], g["delta"]) == (0.25, 0.75, 0.5)
    assert (strict["base"], strict["trained"]) == (0.25, 0.5)   # "70000" was read leniently, not from a box
    assert cli(["grpo", "eval", str(tmp_path / "run"), "--rescore"]) == 0
    assert "differences from eval/summary.json: none" in capsys.readouterr().out


def test_a_wrong_recorded_verdict_is_caught(tmp_path, capsys):
    wrong = TRAINED[:3] + [("\\boxed{541}", True)]   # recorded as right; 541 is not 540
    r = rescore_run(_run(tmp_path, wrong))
    assert not r.reproduces and r.changed == {"base": 0, "trained": 1}
    assert "greedy_pass1.trained: recorded 1.0, re-scored 0.75" in r.differences
    assert cli(["grpo", "eval", str(tmp_path / "run"), "--rescore"]) == 1
    assert "trained: 1 problem(s) scored differently" in capsys.readouterr().out


def test_a_run_without_kept_generations_is_refused_by_name(tmp_path):
    run = _run(tmp_path)
    (run / "eval" / "trained.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no kept trained evaluation \(trained.json\)"):
        rescore_run(run)


def test_without_a_recorded_summary_nothing_is_claimed(tmp_path):
    run = _run(tmp_path)
    (run / "eval" / "summary.json").unlink()
    r = rescore_run(run)
    assert r.recorded is None and not r.reproduces and r.differences == []
    write_json(run / "eval" / "summary.json", r.summary)       # what a user would then keep
    assert rescore_run(run).reproduces


# --- `grpo eval RUN --drop-texts`: the verdicts stay, the texts go, the summary still comes back


def test_dropping_texts_keeps_both_verdicts_and_the_summary(tmp_path, capsys):
    from scalelab.core.jsonio import read_json
    from scalelab.grpo.heldout import load_eval
    run = _run(tmp_path)
    summary = read_json(run / "eval" / "summary.json")
    assert cli(["grpo", "eval", str(run), "--drop-texts"]) == 0
    assert "trained: 4 of 4 texts dropped" in capsys.readouterr().out
    base, trained = load_eval(run, "base"), load_eval(run, "trained")
    assert all(r.greedy_text is None for r in base.examples + trained.examples)
    # strict by hand: only boxed answers count, so "she earns 70000" is right leniently but not strictly
    assert [r.greedy_strict for r in trained.examples] == [True, True, False, False]
    assert [r.greedy_strict for r in base.examples] == [True, False, False, False]
    assert [r.greedy_correct for r in trained.examples] == [True, True, True, False]
    r = rescore_run(run)
    assert r.reproduces and r.summary == summary and r.from_texts == {"base": 0, "trained": 0}
    kept = read_json(run / "eval" / "texts.json")["dropped"]
    assert [(d["policy"], d["rows"], d["texts"]) for d in kept] == [("base", 4, 4), ("trained", 4, 4)]
    assert cli(["grpo", "eval", str(run), "--rescore"]) == 0
    assert "0 of 4 problems graded again from a kept text" in capsys.readouterr().out


def test_dropping_texts_is_refused_when_the_texts_do_not_confirm_the_verdicts(tmp_path):
    from scalelab.grpo.textdrop import drop_texts
    run = _run(tmp_path, TRAINED[:3] + [("\\boxed{541}", True)])  # recorded right; 541 is not 540
    before = (run / "eval" / "trained.json").read_bytes()
    with pytest.raises(ValueError, match="do not re-grade to the recorded verdicts"):
        drop_texts(run)
    assert (run / "eval" / "trained.json").read_bytes() == before and not (run / "eval" / "texts.json").exists()


def test_dropping_texts_twice_is_refused_and_keeps_the_first_record(tmp_path):
    from scalelab.grpo.textdrop import drop_texts
    run = _run(tmp_path)
    drop_texts(run)
    first = (run / "eval" / "texts.json").read_bytes()
    with pytest.raises(ValueError, match="no greedy texts of base, trained to drop"):
        drop_texts(run)
    assert (run / "eval" / "texts.json").read_bytes() == first


def test_a_pointer_to_another_runs_base_is_replaced_by_the_slim_record(tmp_path):
    from scalelab.core.recordgz import point
    from scalelab.grpo.heldout import load_eval
    from scalelab.grpo.textdrop import drop_texts
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = _run(tmp_path / "a"), _run(tmp_path / "b")
    point(second / "eval" / "base.json", first / "eval" / "base.json", {})
    assert (second / "eval" / "base.json.same").exists()
    drop_texts(second)
    assert not (second / "eval" / "base.json.same").exists() and (second / "eval" / "base.json").is_file()
    assert load_eval(first, "base").examples[0].greedy_text == "so \\boxed{18}"  # the target is untouched


def test_dropping_one_policy_keeps_the_others_texts_and_records_both_drops(tmp_path, capsys):
    from scalelab.core.jsonio import read_json
    from scalelab.grpo.heldout import load_eval
    from scalelab.grpo.textdrop import drop_texts
    run = _run(tmp_path)
    summary = read_json(run / "eval" / "summary.json")
    assert cli(["grpo", "eval", str(run), "--drop-texts", "trained"]) == 0
    assert "trained: 4 of 4 texts dropped" in capsys.readouterr().out
    assert [r.greedy_text for r in load_eval(run, "base").examples] == [t for t, _ in BASE]
    assert all(r.greedy_text is None for r in load_eval(run, "trained").examples)
    r = rescore_run(run)
    assert r.reproduces and r.summary == summary and r.from_texts == {"base": 4, "trained": 0}
    with pytest.raises(ValueError, match="no greedy texts of trained"):
        drop_texts(run, ("trained",))
    drop_texts(run, ("base",))  # later the other one: texts.json then names both
    kept = read_json(run / "eval" / "texts.json")["dropped"]
    assert [(d["policy"], d["texts"]) for d in kept] == [("trained", 4), ("base", 4)]
    with pytest.raises(ValueError, match="allowed: base, trained"):
        drop_texts(run, ("reference",))
