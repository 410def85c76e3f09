"""`scalelab calc train|disagg` through scalelab.cli.main: the numbers printed are the numbers computed."""
from __future__ import annotations

import json

import pytest

from scalelab import cli
from scalelab.calc.modelconfig import load_model_file
from scalelab.core.config import ConfigError


@pytest.fixture(autouse=True)
def only_calc(monkeypatch, tmp_path):
    # other jobs' modules are built by other people at the same time: register the calc job alone, and keep
    # any committed NCCL calibration out of these numbers
    monkeypatch.setattr(cli, "JOBS", {"calc": cli.JOBS["calc"]})
    monkeypatch.setenv("SCALELAB_RESULTS_DIR", str(tmp_path / "no-results"))


def run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["calc", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_train_gpt2_ddp_table(capsys):
    code, out = run(capsys, "train", "--model", "gpt2-124m", "--gpus", "8", "--micro-batch", "16", "--seq", "1024",
                    "--global-batch", "512", "--precision", "amp-bf16")
    assert code == 0
    assert "124,439,808 params" in out
    assert "m=4 micro-batches" in out                               # 512 / (16 x 8)
    # ring all-reduce of 497.8 MB fp32 grads over 8 GPUs sends 2·7/8 of it per GPU
    assert "871 MB" in out
    assert "Compute dominates" in out


def test_train_json_summary(capsys):
    code, out = run(capsys, "train", "--model", "llama-3-8b", "--gpus", "16", "--tp", "8", "--sp", "--micro-batch",
                    "1", "--seq", "4096", "--global-batch", "64", "--dp-mode", "zero1", "--json")
    assert code == 0
    doc = json.loads(out)
    s = doc["summary"]
    assert s["params"] == 8_030_261_248 and s["gpus"] == 16 and s["tokens_per_step"] == 64 * 4096
    assert set(s["per_dim"]) == {"DP", "TP"}
    tp = s["per_dim"]["TP"]
    # SP: 2 AG + 2 RS per layer per micro-batch (m = 32), each 4096·4096·2 B, sending 7/8 of it
    assert tp["bytes_per_gpu_step"] == pytest.approx(8 * 32 * 32 * 4096 * 4096 * 2 * 7 / 8)
    assert s["step_s"] >= s["compute_s"] and 0 < s["mfu"] <= s["mfu_bound"] <= 1


def test_train_forward_only_layer_stack(capsys):
    code, out = run(capsys, "train", "--model", "qwen2.5-7b", "--layers", "8", "--no-head", "--forward-only", "--tp",
                    "2", "--gpus", "2", "--micro-batch", "1", "--seq", "4096", "--gpu", "h200", "--json")
    s = json.loads(out)["summary"]
    assert code == 0 and list(s["per_dim"]) == ["TP"]
    # per layer: attention 3584·(3584 + 2·512 + 3584) + QKV bias 4608, SwiGLU 3·3584·18944, 2 RMSNorms; + final norm
    assert s["params"] == 8 * (3584 * 8192 + 4608 + 3 * 3584 * 18944 + 2 * 3584) + 3584
    assert s["per_dim"]["TP"]["exposed_s"] == pytest.approx(s["comm_s"])      # 16 all-reduces, none hidden
    assert s["step_s"] == pytest.approx(s["compute_s"] + s["comm_s"])


def test_train_bad_layout_is_an_error(capsys):
    code, out = run(capsys, "train", "--model", "gpt2-124m", "--gpus", "8", "--tp", "3")
    assert code == 2 and "invalid layout" in out


def test_disagg_long_prompt(capsys):
    code, out = run(capsys, "disagg", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--workload", "long-prompt",
                    "--no-scan")
    assert code == 0
    assert "TP=4 per instance" in out and "327,680 B/token" in out
    assert "2.68 GB: 1.5 ms over NVLink, 13.4 ms over NICs" in out
    assert "Disaggregation pays here" in out


def test_disagg_json_and_overrides(capsys):
    code, out = run(capsys, "disagg", "--workload", "sharegpt", "--prompt-dist", "fixed:2000", "--output-dist",
                    "fixed:100", "--rate", "7", "--tpot-slo", "0.03", "--no-scan", "--json")
    assert code == 0
    doc = json.loads(out)
    r = doc["result"]
    assert r["stats"]["prompt_mean"] == 2000 and r["stats"]["output_mean"] == 100
    assert r["workload"]["tpot_slo_s"] == 0.03 and r["at_rate"]["rate_rps"] == 7
    assert r["fluid_per_gpu"] > r["colocated_per_gpu"]


def test_model_config_calc_schema(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[model]\nname = "tiny"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nffn = 128\nvocab = 1000\n')
    spec, batch = load_model_file(path)
    assert (spec.n_layers, spec.d_model, spec.n_kv_heads, spec.d_ff, spec.vocab_size) == (2, 64, 2, 128, 1000)
    assert batch.micro_batch is None


def test_model_config_from_pretrain_toml(tmp_path, capsys):
    path = tmp_path / "gpt2.toml"
    path.write_text("[model]\nn_layer = 12\nn_head = 12\nn_embd = 768\nblock_size = 1024\n"
                    "[train]\nmicro_batch_size = 16\ntotal_batch_tokens = 524288\nparallel = \"fsdp2\"\n")
    spec, batch = load_model_file(path)
    # padded vocab 50304 (the pretrain default): 124,439,808 + 47 x 768
    assert spec.vocab_size == 50304 and spec.tied_embeddings
    assert (batch.micro_batch, batch.seq, batch.global_batch_tokens, batch.dp_mode) == (16, 1024, 524288, "fsdp")
    assert batch.precision == "amp-bf16"
    code, out = run(capsys, "train", "--model-config", str(path), "--gpus", "2", "--json")
    s = json.loads(out)["summary"]
    assert s["params"] == 124_439_808 + 47 * 768 and s["tokens_per_step"] == 524288
    assert "DP" in s["per_dim"]


def test_model_config_errors_name_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[model]\nlayers = 2\nhiddn = 64\n")
    with pytest.raises(ConfigError, match="hiddn"):
        load_model_file(path)
