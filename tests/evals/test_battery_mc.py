"""The battery's lm-eval half: the harness is called once per task, its result becomes rows whose intervals are
checked by hand (Wilson for a share right, mean ± 1.96·stderr for TruthfulQA MC2's mean probability), its
per-item records are kept gzipped, and a stored task is not run again."""
from __future__ import annotations

import pytest

from scalelab.core.jsonio import read_json, read_jsonl
from scalelab.evals import harness
from scalelab.evals.battery import BatteryConfig, run_battery
from scalelab.evals.harness import EvalResult, Metric, TaskResult


def canned(task: str) -> EvalResult:
    if task == "arc_easy":
        metrics = (Metric("acc", 0.27, 0.0446), Metric("acc_norm", 0.30, 0.0461))
        result, n = TaskResult("arc_easy", "scalelab_arc_easy", metrics, 100, 2376, 0, "a" * 64), 100
    else:
        result = TaskResult("truthfulqa_mc2", "scalelab_truthfulqa_mc2", (Metric("acc", 0.40, 0.02),), 790, 790, 0,
                            "b" * 64)
        n = 790
    samples = {task: [{"doc_id": i, "target": 0, "loglikelihoods": [-1.0, -2.0], "acc": 1.0} for i in range(n)]}
    return EvalResult("m", None, "local", None, (result,), (), None, "0.4.13", "5", "2", "float32", "cpu", 16, 12.5,
                      samples=samples)


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake_run(model_path, tasks, **kw):
        seen.append((tasks, kw["source"], kw["device"], kw["dtype"], kw["log_samples"]))
        return canned(tasks[0])

    monkeypatch.setattr(harness, "run_lm_eval", fake_run)
    return seen


def test_lm_eval_result_becomes_rows_with_the_right_intervals(calls, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    cfg = BatteryConfig(str(tmp_path / "model"), tmp_path / "out", ("arc_easy", "truthfulqa_mc2"),
                        data_dir=tmp_path / "data", lm_eval_device="cpu")
    run_battery(cfg)
    assert calls == [(["arc_easy"], "local", "cpu", "float32", True), (["truthfulqa_mc2"], "local", "cpu", "float32",
                                                                        True)]
    rows = {(r["task"], r["metric"]): r for r in read_json(tmp_path / "out" / "battery.json")["rows"]}
    acc = rows[("arc_easy", "acc")]
    # Wilson, 27 of 100: [0.19270, 0.36432] (worked by hand in test_battery.py)
    assert (acc["n"], acc["ci_method"], acc["stderr"]) == (100, "wilson", 0.0446)
    assert (acc["ci_low"], acc["ci_high"]) == (pytest.approx(0.19270, abs=5e-5), pytest.approx(0.36432, abs=5e-5))
    mc2 = rows[("truthfulqa_mc2", "mc2")]
    # a mean probability: 0.40 ± 1.959964 * 0.02 = [0.36080, 0.43920]
    assert mc2["ci_method"] == "normal"
    assert (mc2["ci_low"], mc2["ci_high"]) == (pytest.approx(0.360801, abs=1e-6), pytest.approx(0.439199, abs=1e-6))
    assert "mean ± 1.96·stderr" in mc2["note"]
    assert len(read_jsonl(tmp_path / "out" / "lm_eval" / "arc_easy_samples.jsonl.gz")) == 100
    lm = read_json(tmp_path / "out" / "lm_eval" / "truthfulqa_mc2.json")
    assert lm["tasks"][0]["n_examples"] == 790
    # the file names its own code and command, as the task summaries do
    assert set(lm["provenance"]) == {"git_sha", "command"} and lm["provenance"]["git_sha"]
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "| arc_easy (acc) | 100 | 27.0% | [19.3%, 36.4%] | — | 0-shot; lm-eval stderr 4.46 pts |" in report
    assert "| truthfulqa_mc2 (mc2) | 790 | 40.0% | [36.1%, 43.9%] |" in report
    run_battery(cfg)
    assert len(calls) == 2  # both stored with the same settings: lm-eval not called again


@pytest.mark.slow
def test_a_real_tiny_lm_eval_run_through_the_battery(shared_data, tmp_path):
    """A random 2-layer GPT-2 (tests.pretrain.test_export) on 5 ARC-Easy items: the row is lm-eval's acc, n is
    5, the interval is Wilson's from them, and the stored per-item records average to the same acc."""
    from tests.pretrain.test_export import export_run, make_run
    from scalelab.evals.intervals import wilson_interval
    make_run(tmp_path / "run", "model.block_size=256")
    export_run(tmp_path / "run", tmp_path / "hf")
    cfg = BatteryConfig(str(tmp_path / "hf"), tmp_path / "out", ("arc_easy",), limit=5, data_dir=shared_data,
                        lm_eval_device="cpu", lm_eval_batch_size=5)
    run_battery(cfg)
    b = read_json(tmp_path / "out" / "battery.json")
    acc = next(r for r in b["rows"] if r["metric"] == "acc")
    samples = read_jsonl(tmp_path / "out" / "lm_eval" / "arc_easy_samples.jsonl.gz")
    assert acc["n"] == len(samples) == 5
    assert acc["value"] == pytest.approx(sum(s["acc"] for s in samples) / 5)
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx(wilson_interval(acc["value"], 5))
    assert b["tasks"]["arc_easy"]["settings"]["dtype"] == "float32"
