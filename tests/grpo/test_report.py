"""The GRPO report from a hand-made run folder (events in train.py's format), and the reward-hacking monitor and
dead-zone finder on hand-made numbers; every expected value below is worked out by hand."""
from __future__ import annotations

import json

import pytest

from scalelab.cli import main
from scalelab.core.config import load_config
from scalelab.core.rundir import RunDir
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.report import (DeadZoneRule, MonitorThresholds, build_report, dead_zones, format_only_flag,
                                  length_hacking_flag, phase_spans, quarter_means)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Two step shapes, alternated. Per-step shares: A = rollout .5, reward .1, update .3, sync .05, other .05;
# B = rollout .8, reward .05, update .1, sync .025, other .025. Means over A, B, A, B: rollout 65.0%,
# reward 7.5%, update 20.0%, weight_sync 3.75%, other 3.75%; mean rollout ms (500 + 1600) / 2 = 1050.
STEP_A = {"rollout_ms": 500.0, "reward_ms": 100.0, "update_ms": 300.0, "weight_sync_ms": 50.0, "step_ms": 1000.0,
          "rollout_tokens_per_s": 40.0}
STEP_B = {"rollout_ms": 1600.0, "reward_ms": 100.0, "update_ms": 200.0, "weight_sync_ms": 50.0, "step_ms": 2000.0,
          "rollout_tokens_per_s": 60.0}
# Predicted: measured medians are 50 tok/s, 1050 ms rollout, 1500 ms step -> ratios 0.50, 2.10, 1.50.
PREDICTED = {"rollout_tokens_per_s": 100.0, "rollout_ms": 500.0, "reference_ms": 0.0, "update_ms": 250.0,
             "weight_sync_ms": 0.0, "step_ms": 1000.0}


def step_record(step: int, shape: dict, length: float, correct: float, fmt: float) -> dict:
    lengths = {"len_mean": length, "len_p10": length - 2, "len_p50": length, "len_p90": length + 2,
               "len_max": length + 4, "len_min": length - 4}
    return {"step": step, "rollout_version": step, "staleness": 0, "reference_ms": 0.0, "old_logprob_ms": 0.0,
            **shape, "overlapped_step_ms": shape["step_ms"] - shape["rollout_ms"], "rollout_tokens": 64,
            "generated_tokens_this_step": 64, "finished_frac": 1.0, **lengths,
            "reward_mean": correct + 0.5 * fmt, "reward_std": 0.1, "zero_signal_frac": 0.0, "adv_abs_mean": 0.5,
            "lr": 1e-5, "reward/correctness": correct, "reward/format": fmt, "loss": 0.1, "grad_norm": 0.2,
            "clip_frac": 0.0, "kl_mean": 0.01 * step, "is_weight_mean": 1.0, "is_truncated_frac": 0.0,
            "behavior_mismatch_k3": 0.0, "behavior_logp_abs_diff": 0.0, "completion_lengths": [int(length)] * 4,
            "completion_rewards": {"correctness": [correct] * 4, "format": [fmt] * 4}, "example_ids": ["a", "b"],
            "sync_bytes": 0, "sync_restarted": False}


def gpu_event(step: int, t_s: list[float], util: list[float], phase: list[str]) -> dict:
    return {"step": step, "t_s": t_s, "gpu": [0] * len(t_s), "util_pct": util,
            "mem_used_bytes": [2**30] * len(t_s), "phase": phase}


def make_run(tmp_path, gpu: bool = True, *overrides: str) -> RunDir:
    cfg = load_config(GrpoConfig, None, [f"run.out_dir={tmp_path}", "run.name=hand", "train.max_steps=4",
                                        "loss.kl_coef=0.05", "data.rewards=['correctness','format']",
                                        "data.reward_weights=[1.0,0.5]", *overrides])
    run = RunDir(cfg.run_dir).create(cfg)
    run.write_predictions({"step": PREDICTED, "hardware": "cpu"})
    run.log_event("gpu_monitor", available=gpu, reason="" if gpu else "NVML unavailable (test)", hz=2.0)
    for step, shape in enumerate([STEP_A, STEP_B, STEP_A, STEP_B]):
        run.log_event("grpo_step", **step_record(step, shape, 10.0 + step, 0.4 + 0.1 * step, 0.5))
        if gpu and step == 0:
            # low 10.5..12.0 (1.5 s, kept), low 12.5..13.0 (0.5 s, too short)
            run.log_event("gpu_samples", **gpu_event(0, [10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0],
                                                      [50, 5, 5, 5, 80, 0, 90],
                                                      ["rollout", "reward", "reward", "update", "update", "other",
                                                       "rollout"]))
        if gpu and step == 1:
            # low from 13.5 to the last sample at 15.0 (1.5 s, kept)
            run.log_event("gpu_samples", **gpu_event(1, [13.5, 14.0, 15.0], [3, 3, 3], ["weight_sync"] * 3))
    return run


def test_report_shows_hand_computed_shares_ratios_and_dead_zones(tmp_path):
    run = make_run(tmp_path)
    text = build_report(run.path).read_text()
    for row in ("| rollout | 1,050.0 | 65.0% |", "| reward | 100.0 | 7.5% |", "| update | 250.0 | 20.0% |",
                "| weight_sync | 50.0 | 3.8% |", "| other | 50.0 | 3.8% |",
                "| rollout tokens/s (tokens/s) | 100.0 | 50.0 | 0.50 |", "| rollout (ms) | 500.0 | 1,050.0 | 2.10 |",
                "| step time (ms) | 1,000.0 | 1,500.0 | 1.50 |", "| reference (ms) | 0.0 | 0.0 | — |",
                "| 0 | 0.50 | 2.00 | 1.50 | reward, update |", "| 0 | 3.50 | 5.00 | 1.50 | weight_sync |"):
        assert row in text, row
    assert "Dead zones (utilization < 10% for >= 1 s" in text and "GPU 0: 3.00 s (60.0%)" in text
    # quarter = 1 step: correctness 0.4 -> 0.7, total 0.65 -> 0.95, length 10 -> 13 (+30%, not above)
    assert "| reward/correctness | 0.400 | 0.700 |" in text and "| total (weighted) | 0.650 | 0.950 |" in text
    assert "mean length 10.0 -> 13.0 tokens (+30%" in text and "no flags" in text
    for name in ("step_time", "rewards", "kl", "lengths", "gpu"):
        assert (run.path / "figures" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert f"figures/{name}.png" in text


@pytest.mark.parametrize("log_kl, text", [
    # kl_mean = 0.01 * step over 4 steps: quarters 0 -> 0.03, max 0.03
    ("true", "Mean k3 KL to the reference per token: 0 (first quarter) -> 0.03 (last), max 0.03. Measured only"),
    ("false", "loss.kl_coef = 0 and loss.log_kl off: no reference pass, so the logged KL is 0 by construction.")])
def test_kl_at_kl_coef_zero_is_reported_when_it_was_measured(tmp_path, log_kl, text):
    run = make_run(tmp_path, False, "loss.kl_coef=0", f"loss.log_kl={log_kl}")
    assert text in build_report(run.path).read_text()


def test_cpu_run_says_no_nvml_samples_and_draws_no_gpu_figure(tmp_path, capsys):
    run = make_run(tmp_path, gpu=False)
    assert main(["grpo", "report", str(run.path)]) == 0
    text = (run.path / "REPORT.md").read_text()
    assert "No NVML samples were recorded; the GPU monitor said: NVML unavailable (test)." in text
    assert not (run.path / "figures" / "gpu.png").exists()
    assert "REPORT.md" in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["metrics.jsonl", "config.toml"])
def test_missing_file_is_named(tmp_path, missing):
    run = make_run(tmp_path, gpu=False)
    (run.path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
        build_report(run.path)


def test_resumed_step_keeps_the_later_record(tmp_path):
    run = make_run(tmp_path, gpu=False)
    with open(run.metrics_path, "a") as f:  # step 3 re-run after a crash, now at shape A
        f.write(json.dumps({"event": "grpo_step", "time_unix": 0.0, **step_record(3, STEP_A, 13.0, 0.7, 0.5)}) + "\n")
    text = build_report(run.path).read_text()
    assert "| rollout | 775.0 | 57.5% |" in text  # (500 + 1600 + 500 + 500) / 4; (.5 + .8 + .5 + .5) / 4
    assert "4 of 4 steps" in text


# ---------------------------------------------------------------------------------------------
# monitor and dead zones on plain numbers


def test_quarter_means_use_at_least_one_value():
    assert quarter_means([1.0, 2.0, 3.0]) == (1.0, 3.0)
    assert quarter_means([1, 1, 2, 2, 3, 3, 4, 4]) == (1.0, 4.0)


def test_length_hacking_trajectory_is_flagged_with_its_numbers():
    lengths = [10, 10, 12, 14, 16, 18, 20, 16]  # quarters (2 steps): 10 -> 18, +80%
    correct = [0.50, 0.50, 0.50, 0.51, 0.50, 0.51, 0.50, 0.51]  # 0.500 -> 0.505, +0.5 points
    flag = length_hacking_flag(lengths, correct)
    assert flag.checked and flag.triggered
    assert "10.0 -> 18.0 tokens (+80%" in flag.detail and "0.500 -> 0.505 (+0.5 points" in flag.detail


def test_honest_trajectories_are_not_flagged():
    lengths = [10, 10, 12, 14, 16, 18, 20, 16]
    learning = [0.30, 0.30, 0.40, 0.45, 0.50, 0.55, 0.60, 0.60]  # +30 points alongside the growth
    assert not length_hacking_flag(lengths, learning).triggered
    flat = [10.0] * 8  # no growth, no learning
    assert not length_hacking_flag(flat, [0.5] * 8).triggered
    assert not length_hacking_flag([10, 13, 13, 13], [0.5] * 4).triggered  # exactly +30% is not above it
    assert length_hacking_flag([10, 13, 13, 14], [0.5] * 4).triggered  # +40%


def test_length_flag_needs_correctness():
    flag = length_hacking_flag([10, 20, 30, 40], None)
    assert not flag.checked and not flag.triggered


def test_format_only_reward_is_flagged_and_real_answers_are_not():
    flag = format_only_flag([0.2, 0.6, 0.9, 0.95], [0.05, 0.05, 0.08, 0.10])
    assert flag.triggered and "format 0.950" in flag.detail and "correctness 0.100" in flag.detail
    assert not format_only_flag([0.2, 0.6, 0.9, 0.95], [0.1, 0.3, 0.6, 0.7]).triggered
    assert not format_only_flag([0.1, 0.1, 0.2, 0.3], [0.0, 0.0, 0.0, 0.0]).triggered
    th = MonitorThresholds(format_high=0.25)
    assert format_only_flag([0.1, 0.1, 0.2, 0.3], [0.0, 0.0, 0.0, 0.0], th).triggered


def test_dead_zones_end_at_the_first_busy_sample_and_respect_the_minimum():
    t = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    u = [50, 9, 9.9, 0, 10, 0, 50, 1, 2]
    rule = DeadZoneRule(util_below_pct=10.0, min_duration_s=0.5)
    # 0.5..2.0 (10 is not below 10), 2.5..3.0, 3.5..4.0 (the run's end)
    assert dead_zones(t, u, rule) == [(0.5, 2.0), (2.5, 3.0), (3.5, 4.0)]
    assert dead_zones(t, u, DeadZoneRule(10.0, 1.0)) == [(0.5, 2.0)]
    assert dead_zones(t, [50] * 9, rule) == []


def test_phase_spans_run_until_the_next_phase_starts():
    spans = phase_spans([0.0, 1.0, 2.0, 3.0, 4.0], ["rollout", "rollout", "update", "update", "other"])
    assert spans == [(0.0, 2.0, "rollout"), (2.0, 4.0, "update"), (4.0, 4.0, "other")]
