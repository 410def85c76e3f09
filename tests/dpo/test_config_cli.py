"""The dpo config (named files, validation naming the field), sweep layout, CLI wiring, predictions."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from scalelab.cli import build_parser, main
from scalelab.core.config import ConfigError
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.predict import ModelShape, predict
from scalelab.dpo.run import sweep_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "dpo"


@pytest.mark.parametrize("name", ["tiny-cpu", "smollm2-h200", "qwen2.5-7b-instruct"])
def test_named_configs_load(name):
    cfg = load_dpo_config(CONFIGS / f"{name}.toml")
    assert cfg.run.name == name and cfg.train.loss == "dpo"


def test_validation_names_the_field():
    with pytest.raises(ConfigError, match="train.precompute_ref_logprobs"):
        load_dpo_config(None, ["train.loss='orpo'", "train.precompute_ref_logprobs=true"])
    with pytest.raises(ConfigError, match=r"train\.loss.*allowed values: 'dpo', 'ipo', 'orpo'"):
        load_dpo_config(None, ["train.loss='kto'"])
    with pytest.raises(ConfigError, match="hub.repo_id"):
        load_dpo_config(None, ["hub.push=true"])


def test_sweep_layout_shares_the_preference_set(tmp_path):
    cfg = load_dpo_config(None, [f"run.out_dir='{tmp_path}'"])
    runs = sweep_configs(cfg, [0.05, 0.3], ["dpo", "ipo"], "s1")
    assert [(c.train.loss, c.train.beta, c.run.name) for c in runs] == [
        ("dpo", 0.05, "dpo-beta0.05"), ("dpo", 0.3, "dpo-beta0.3"),
        ("ipo", 0.05, "ipo-beta0.05"), ("ipo", 0.3, "ipo-beta0.3")]
    assert {c.run_dir.parent for c in runs} == {tmp_path / "s1"}
    assert {c.data.path for c in runs} == {str(tmp_path / "s1" / "preferences.jsonl")}


def test_cli_parses_dpo_verbs(capsys):
    args = build_parser().parse_args(["dpo", "sweep", "--beta", "0.05,0.1", "--loss", "dpo,orpo"])
    assert args.beta == [0.05, 0.1] and args.loss == ["dpo", "orpo"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dpo", "sweep", "--loss", "kto"])
    assert "unknown loss 'kto'" in capsys.readouterr().err
    assert main(["dpo", "config"]) == 0
    assert "train.beta" in capsys.readouterr().out


def _shape():
    return ModelShape(n_params=134_515_008, lora_params=4_884_480, hidden=576, layers=30, bytes_per_param=4,
                      memory_in_use_bytes=2 * 2**30)


def test_gpu_step_time_adds_the_dispatch_overhead_per_layer_and_pass():
    cfg = load_dpo_config(None, ["run.gpu='h200'", "train.max_steps=10", "train.batch_size=32"])
    p = predict(cfg, _shape(), mean_sequence_tokens=100.0, n_train_pairs=320, device_type="cuda",
                uses_reference=True)
    flop_s = 2 * 134_515_008 * (2 * 32 * 100) * 3 / (0.30 * 989.4e12)
    # 30 layers x 3 passes x 3.3 ms: the H200 measurement (0.31 s) that the FLOP term alone misses 26x
    assert p.overhead_s == pytest.approx(30 * 3 * 3.3e-3)
    assert p.step_s == pytest.approx(flop_s + 0.297, rel=1e-3)
    assert p.step_s_low < p.step_s < p.step_s_high and 0.25 < p.step_s < 0.35


def test_predictions_by_hand():
    cfg = load_dpo_config(None, ["run.gpu='cpu'", "train.max_steps=10", "train.batch_size=4"])
    p = predict(cfg, _shape(), mean_sequence_tokens=50.0, n_train_pairs=40, device_type="cpu",
                uses_reference=True)
    # 2 N x (2 x 4 pairs x 50 tokens) x (fwd + bwd-to-activations + reference fwd)
    assert p.flops_per_step == pytest.approx(2 * 134_515_008 * 400 * 3)
    assert p.step_s == pytest.approx(p.flops_per_step / (0.30 * 0.192e12))
    assert p.initial_loss == pytest.approx(math.log(2)) and p.epochs == pytest.approx(1.0)
    # 2 GiB in use + 4,884,480 LoRA params x 16 B + 3.2 x 34 x 576 x 2 B (fp32) x 400 tokens x 30 layers
    act = 3.2 * 34 * 576 * 2 * 400 * 30
    assert p.peak_memory_gib == pytest.approx((2 * 2**30 + 4_884_480 * 16 + act) / 2**30)
    assert p.heldout_reward_accuracy == pytest.approx(0.5 + 0.25 * (1 - math.exp(-1)))
    ipo = load_dpo_config(None, ["train.loss='ipo'", "train.beta=0.05", "train.precompute_ref_logprobs=true"])
    q = predict(ipo, _shape(), 50.0, 40, "cpu", uses_reference=True)
    assert q.initial_loss == pytest.approx(100.0) and q.forward_passes_per_step == 2.0


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-gsm8k-h200", "qwen2.5-coder-1.5b-hh-h200"])
def test_the_1_5b_configs_load_and_their_runs_see_at_least_ten_margin_points(name):
    from scalelab.dpo.sweep_plan import expected_pairs, margin_points, planned_runs, train_share
    cfg = load_dpo_config(CONFIGS / f"{name}.toml")
    assert cfg.model.name == "qwen2.5-coder-1.5b-instruct-q4km" and cfg.train.save_steps > 0
    if cfg.data.source == "verifier":
        # the fewest pairs the header allows: per-question accuracies mostly all-or-nothing (Beta, a + b = 1)
        n_train = round(expected_pairs(cfg, 0.63, concentration=1.0) * train_share(cfg))
        assert 3_000 < n_train < expected_pairs(cfg, 0.63, float("inf"))
    else:
        n_train = 2_303 - 241                                    # parsed HH pairs less the hash-held-out ones
    assert margin_points(cfg, n_train) >= 10
    assert all(r.learning_rate > 0 for r in planned_runs(cfg))


def test_the_gsm8k_sweep_plan_and_its_rule():
    from scalelab.dpo.sweep_plan import planned_runs
    cfg = load_dpo_config(CONFIGS / "qwen2.5-coder-1.5b-gsm8k-h200.toml")
    runs = [(r.name, r.learning_rate) for r in planned_runs(cfg)]
    lr = cfg.train.learning_rate
    assert runs == [("dpo-beta0.05", lr), ("dpo-beta0.1", lr), ("dpo-beta0.3", lr), ("ipo-beta1", lr),
                    ("orpo-beta0.1", 8e-6)]
    assert cfg.selection.losses == ["dpo"] and cfg.selection.tie_break == "larger_beta"
    b = cfg.battery
    assert b.mmlu_subset >= 2000 and b.mmlu_base_full and b.target_n == 1319
    assert {"humaneval", "mbpp", "toolcall_schema", "toolcall_args", "ifeval_lite"} <= set(b.own_tasks)


def test_plan_counts_by_hand():
    from scalelab.dpo.sweep_plan import margin_points, mixed_share, planned_steps
    cfg = load_dpo_config(None, ["train.max_steps=0", "train.num_epochs=2.0", "train.batch_size=8",
                                 "train.grad_accum=4", "margins.every_steps=10"])
    # 1,000 pairs: 125 micro-batches, 32 steps per epoch (the last one partial), 64 steps; margins at 0, 10..60, 64
    assert planned_steps(cfg.train, 1000) == 64 and margin_points(cfg, 1000) == 8
    assert mixed_share(0.5, 2, float("inf")) == pytest.approx(0.5)
    # Beta(1, 1) = uniform accuracies: P(both of 2 right) = 1/3, P(both wrong) = 1/3
    assert mixed_share(0.5, 2, 2.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="0 < accuracy < 1"):
        mixed_share(1.0, 8, 2.0)


def test_sweep_verb_without_beta_or_loss_runs_the_config_plan(tmp_path, monkeypatch):
    from scalelab.dpo import run as dpo_run
    seen = []
    monkeypatch.setattr(dpo_run, "run_configs", lambda cfg, configs, name, skip: seen.append(
        ([(c.run.name, c.train.learning_rate) for c in configs], skip)) or [])
    assert main(["dpo", "sweep", "--set", "sweep.ipo_taus=[0.5]", "--set", "sweep.ipo_learning_rate=1e-5",
                 "--set", f"run.out_dir='{tmp_path}'", "--skip-trained"]) == 0
    assert seen[-1] == ([("dpo-beta0.05", 5e-5), ("dpo-beta0.1", 5e-5), ("dpo-beta0.3", 5e-5),
                         ("ipo-beta0.5", 1e-5)], True)
    assert main(["dpo", "sweep", "--loss", "orpo", "--set", f"run.out_dir='{tmp_path}'"]) == 0
    assert [n for n, _ in seen[-1][0]] == ["orpo-beta0.05", "orpo-beta0.1", "orpo-beta0.3"]
    assert main(["dpo", "sweep", "--only", "dpo-beta0.3,dpo-beta0.05", "--set", f"run.out_dir='{tmp_path}'"]) == 0
    assert [n for n, _ in seen[-1][0]] == ["dpo-beta0.05", "dpo-beta0.3"]
    assert main(["dpo", "sweep", "--only", "dpo-beta9", "--set", f"run.out_dir='{tmp_path}'"]) == 2
