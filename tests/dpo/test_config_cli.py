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
