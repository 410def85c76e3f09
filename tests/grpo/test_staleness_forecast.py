"""bench/grpo_staleness_forecast.py: the drift models and the fit on hand-computed values, and the forecast read
from a run's metrics."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from scalelab.core.jsonio import append_jsonl
from scalelab.core.rundir import RunDir
from tests.bench_script import load_bench

REPO = Path(__file__).resolve().parents[2]
fc = load_bench("grpo_staleness_forecast")


def test_the_power_fit_recovers_a_and_p_and_ignores_an_outlier_step_of_one_run():
    t = np.repeat(np.arange(1, 41), 3)
    kl = 0.001 * t ** 1.5
    kl[t == 20] = [0.001 * 20 ** 1.5, 0.001 * 20 ** 1.5, 5.0]   # one run's spike: the median keeps the fit
    a, p = fc.fit_power(t, kl)
    assert a == pytest.approx(0.001, rel=1e-9) and p == pytest.approx(1.5, rel=1e-9)


def test_the_two_drift_models_by_hand():
    # KL to the base 0.04 at t = 20 and 0.01 at t = 10, k = 10: random walk 0.04 * 10 / 20 = 0.02;
    # directed (sqrt 0.04 - sqrt 0.01)^2 = (0.2 - 0.1)^2 = 0.01
    d = fc.divergence(0.04, 0.01, 20, 10)
    assert d["random_walk"] == pytest.approx(0.02) and d["directed"] == pytest.approx(0.01)
    assert fc.divergence(0.04, 0.0, 20, 20)["directed"] == pytest.approx(0.04)   # back to the base itself


def test_smoothing_is_the_median_of_five_steps_and_zero_before_the_start():
    t = np.arange(0, 11)
    kl = np.array([0, 1, 2, 3, 100, 5, 6, 7, 8, 9, 10], dtype=float)
    # steps 2..6 hold 2, 3, 100, 5, 6: the median 5 leaves the spike out
    assert fc.smoothed(t, kl, 4) == 5.0 and fc.smoothed(t, kl, 0) == 0.0 and fc.smoothed(t, kl, -3) == 0.0


def test_the_forecast_of_a_run_whose_kl_grows_linearly_is_the_random_walk(tmp_path):
    # a real step record of the committed recipe run, its step, KL and mismatch replaced
    template = next(RunDir(REPO / "results/h100/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-lr5e-5-s1").events("grpo_step"))
    run = tmp_path / "run"
    run.mkdir()
    for step in range(0, 43):
        append_jsonl(run / "metrics.jsonl", {**template, "step": step, "kl_mean": 0.002 * step,
                                             "behavior_mismatch_k3": 0.0003})
    f = fc.forecast([run], steps=40, ks=[4])
    assert f["fit"]["p"] == pytest.approx(1.0, abs=1e-6) and f["floor_k3"] == pytest.approx(0.0003)
    row = {(r["k"], r["step"]): r for r in f["mismatch"]}[(4, 40)]
    assert row["random_walk"] == pytest.approx(0.0003 + 0.08 * 4 / 40)
    assert row["directed"] == pytest.approx(0.0003 + (math.sqrt(0.08) - math.sqrt(0.072)) ** 2)
    assert fc.main([str(run), "--ks", "4", "--out", str(tmp_path / "f.json")]) == 0
    written = json.loads((tmp_path / "f.json").read_text())
    assert written["mismatch"] == f["mismatch"]
    assert written["command"].endswith(f"{run} --ks 4 --out {tmp_path / 'f.json'}")
    assert written["git_sha"]
