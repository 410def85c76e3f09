"""The committed held-out generations (stored gzipped) load and re-score to the committed eval/summary.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.jsonio import read_json
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.heldout import compare, load_eval

RESULTS = Path(__file__).resolve().parents[2] / "results" / "h200" / "grpo"
RUNS = ["seeds/seed0", "hacking/exploit", "staleness/k8"]


@pytest.mark.parametrize("run", RUNS)
def test_gzipped_generations_rescore_to_the_committed_summary(run):
    d = RESULTS / run
    if not (d / "eval" / "summary.json").is_file():
        pytest.skip(f"{d}: committed results not present")
    assert (d / "eval" / "base.json.gz").is_file() and not (d / "eval" / "base.json").exists()
    base, trained = load_eval(d, "base"), load_eval(d, "trained")
    assert base is not None and trained is not None and len(base.examples) == len(trained.examples) > 0
    summary = json.loads(json.dumps(compare(base, trained, load_grpo_config(d / "config.toml"))))
    assert summary == read_json(d / "eval" / "summary.json")
