"""The target part's strict column beside its lenient one (the GSM8K reference protocol): a boxed answer counts in
both, a bare last number only in the lenient."""
from __future__ import annotations

from scalelab.dpo import battery as bat
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.generate import Generation
from scalelab.evals.tasks import get_task


def test_gsm8k_target_scores_strict_and_lenient(shared_data, monkeypatch):
    cfg = load_dpo_config(None, ["verifier.task='gsm8k'", "verifier.task_options={prompt_format='qwen_boxed'}",
                                 "battery.parts=['target']", "battery.target_n=3", f"battery.data_dir='{shared_data}'"])
    (part,) = bat.plan(cfg)
    gold = [ex.answer for ex in get_task("gsm8k", prompt_format="qwen_boxed").load("test", limit=3)]
    replies = [f"So the total is \\boxed{{{gold[0]}}}.", f"The answer is {gold[1]}.", "\\boxed{-1}"]
    monkeypatch.setattr(bat, "greedy_generate", lambda model, tok, prompts, n, b: [
        Generation(text, 7, False) for text in replies[:len(prompts)]])
    side = bat.Side("base", shared_data, cfg)
    side._model = (None, None)                                 # generation is stubbed: no model is loaded
    record = bat.measure_generation(part, side)
    assert list(record["scores"]["target"]["values"].values()) == [1.0, 1.0, 0.0]        # lenient
    assert list(record["scores"]["target_strict"]["values"].values()) == [1.0, 0.0, 0.0]  # strict
    assert [r["strict"] for r in record["examples"]] == [True, False, False]


def test_tasks_without_an_answer_marker_have_no_strict_column():
    ex = get_task("arithmetic").load("test", limit=1)[0]
    assert bat.strict_of(ex, "42") is None
