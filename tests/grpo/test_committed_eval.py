"""The committed held-out generations (stored compressed) load and re-score to the committed eval/summary.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.jsonio import read_json, stored
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.heldout import compare, load_eval

RESULTS = Path(__file__).resolve().parents[2] / "results" / "h200" / "grpo"
RUNS = ["seeds/seed0", "hacking/exploit", "staleness/k8", "qwen2.5-coder-0.5b-gsm8k/recipe-lr2e-5-s0",
        "qwen2.5-coder-0.5b-gsm8k/recipe-lr5e-5-s0", "qwen2.5-coder-0.5b-gsm8k/recipe-lr1e-4-s0",
        "qwen2.5-coder-0.5b-gsm8k/recipe-lr2e-4-s0"]
# the recipe's runs keep greedy texts (seed 1 both policies', seed 0 its base's: its trained texts went for room,
# `grpo eval --drop-texts trained`); the learning-rate sweep's kept its verdicts only (grpo/textdrop.py)
REAL = sorted((RESULTS.parents[1] / "h100" / "grpo" / "qwen2.5-coder-0.5b-gsm8k").glob("recipe-*"))


@pytest.mark.parametrize("run", RUNS)
def test_gzipped_generations_rescore_to_the_committed_summary(run):
    d = RESULTS / run
    if not (d / "eval" / "summary.json").is_file():
        pytest.skip(f"{d}: committed results not present")
    assert stored(d / "eval" / "base.json").suffix in (".gz", ".xz", ".same") and not (d / "eval" / "base.json").exists()
    base, trained = load_eval(d, "base"), load_eval(d, "trained")
    assert base is not None and trained is not None and len(base.examples) == len(trained.examples) > 0
    summary = json.loads(json.dumps(compare(base, trained, load_grpo_config(d / "config.toml"))))
    assert summary == read_json(d / "eval" / "summary.json")


def test_the_recipe_runs_with_texts_are_found():
    assert len(REAL) >= 2, REAL


@pytest.mark.parametrize("run", REAL, ids=lambda p: p.name)
def test_real_gsm8k_generations_rescore_from_their_text(run, shared_data):
    """Every stored greedy completion scored again by the task (the reference protocol's lenient reading) gives
    the stored verdict; the strict column is recomputed from the same texts by compare()."""
    from scalelab.evals.tasks import get_task
    d = run
    if not (d / "eval" / "summary.json").is_file():
        pytest.skip(f"{d}: committed results not present")
    cfg = load_grpo_config(d / "config.toml")
    task = get_task(cfg.data.task, **cfg.data.task_options)
    examples = {e.id: e for e in task.load(cfg.eval.split, str(shared_data / "gsm8k"))}
    texts = 0
    for policy in ("base", "trained"):
        ev = load_eval(d, policy)
        assert len(ev.examples) == 1319
        for r in ev.examples:
            if r.greedy_text is not None:
                texts += 1
                assert task.score(examples[r.id], r.greedy_text).correct == r.greedy_correct, (policy, r.id)
    assert texts >= 1319  # at least one policy's every answer
