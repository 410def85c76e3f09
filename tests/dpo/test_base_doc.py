"""dpo.base_doc: the write-up's section on the real base's own battery, from a hand-made battery.json."""
from __future__ import annotations

import json

from scalelab.dpo.base_doc import base_md, missing_tasks

BATTERY = {
    "model": {"name": "m-q4", "sha256": "ab" * 32, "sha256_of": "GGUF file"},
    "settings": {"tasks": ["gsm8k", "mmlu", "humaneval", "piqa"]},
    "rows": [
        {"task": "gsm8k", "metric": "lenient", "n": 1319, "value": 0.6293, "ci_low": 0.60286, "ci_high": 0.65492,
         "note": "mean 310 tokens"},
        {"task": "humaneval", "metric": "pass@1", "n": 164, "value": 0.5, "ci_low": None, "ci_high": None},
    ],
    "provenance": {"git_sha": "0123456789abcdef", "hardware": {"gpus": ["NVIDIA H200"]},
                   "packages": {"vllm": "0.26.0"}},
}


def test_rows_intervals_and_the_planned_tasks_not_yet_measured(tmp_path):
    (tmp_path / "battery.json").write_text(json.dumps(BATTERY))
    assert missing_tasks(BATTERY) == ["mmlu", "piqa"]
    text = "\n".join(base_md(tmp_path, "results/x"))
    assert "## The base model before tuning: m-q4" in text
    assert "weights sha256 abababababababab…, of the GGUF file" in text
    assert "(`results/x`, git 0123456789, NVIDIA H200, vLLM 0.26.0" in text
    assert "| gsm8k | lenient | 1,319 | 62.9% | 60.3-65.5% | mean 310 tokens |" in text
    assert "| humaneval | pass@1 | 164 | 50.0% |  |  |" in text
    assert "Not measured yet: mmlu, piqa (" in text


def test_a_complete_battery_lists_nothing_missing(tmp_path):
    done = {**BATTERY, "settings": {"tasks": ["gsm8k", "humaneval"]}}
    (tmp_path / "battery.json").write_text(json.dumps(done))
    assert missing_tasks(done) == []
    assert "Not measured yet" not in "\n".join(base_md(tmp_path))
