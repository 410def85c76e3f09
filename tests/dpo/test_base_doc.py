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
    "server": {"command": ["vllm", "serve"]},
}


def test_rows_intervals_and_the_planned_tasks_not_yet_measured(tmp_path):
    (tmp_path / "battery.json").write_text(json.dumps(BATTERY))
    assert missing_tasks(BATTERY) == ["mmlu", "piqa"]
    text = "\n".join(base_md([(tmp_path, "results/x")]))
    assert "## The base model before tuning: m-q4" in text
    assert "weights sha256 abababababababab…, of the GGUF file" in text
    assert "(`results/x`, git 0123456789, NVIDIA H200, vLLM 0.26.0 greedy for generation), with" in text
    assert "| gsm8k | lenient | 1,319 | 62.9% | 60.3-65.5% | mean 310 tokens |" in text
    assert "| humaneval | pass@1 | 164 | 50.0% |  |  |" in text
    assert "Not measured yet: mmlu, piqa (" in text


def test_a_complete_battery_lists_nothing_missing(tmp_path):
    done = {**BATTERY, "settings": {"tasks": ["gsm8k", "humaneval"]}}
    (tmp_path / "battery.json").write_text(json.dumps(done))
    assert missing_tasks(done) == []
    assert "Not measured yet" not in "\n".join(base_md([(tmp_path, None)]))


MC = {"model": BATTERY["model"], "settings": {"tasks": ["mmlu", "piqa"]}, "server": {},
      "rows": [{"task": "mmlu", "metric": "acc", "n": 14042, "value": 0.4841, "ci_low": 0.476, "ci_high": 0.492,
                "note": "5-shot"}],
      "provenance": {"git_sha": "fedcba9876543210", "hardware": {"gpus": ["NVIDIA H100 80GB HBM3"]},
                     "packages": {"lm-eval": "0.4.13"}}}


def test_two_folders_make_one_section_and_only_what_neither_measured_is_missing(tmp_path):
    """The generative tasks in one folder and the multiple-choice ones in another (two windows, two machines): one
    heading, both sources named with what measured them, the rows in folder order, and a task planned by the first
    folder is not "missing" when the second measured it."""
    gen, mc = tmp_path / "generate", tmp_path / "mc-1"
    for folder, battery in ((gen, BATTERY), (mc, MC)):
        folder.mkdir()
        (folder / "battery.json").write_text(json.dumps(battery))
    text = "\n".join(base_md([(gen, "g"), (mc, "m")]))
    assert text.count("## The base model before tuning") == 1
    assert ("(`g`, git 0123456789, NVIDIA H200, vLLM 0.26.0 greedy for generation; `m`, git fedcba9876, "
            "NVIDIA H100 80GB HBM3, lm-eval 0.4.13 for multiple choice), with") in text
    assert text.index("| gsm8k |") < text.index("| humaneval |") < text.index("| mmlu | acc | 14,042 | 48.4% | 47.6-49.2% |")
    assert "Not measured yet: piqa (" in text      # mmlu, planned by the first folder, measured by the second
