"""TRL + peft on a tiny random Llama: DPO learns, the adapter round-trips, IPO/ORPO/precompute/resume plumbing."""
from __future__ import annotations

import math

import pytest
import torch

from scalelab.core.hfmodel import load_causal_lm
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.export import merge_adapter, push_folder
from scalelab.dpo.train import TrainerInputs, build_trainer, resume_point, save_adapter, train
from tests.dpo.conftest import arithmetic_pairs

pytestmark = pytest.mark.slow


def _cfg(model_dir, *overrides):
    return load_dpo_config(None, [f"model.name='{model_dir}'", "model.device='cpu'", "train.batch_size=4",
                                  "train.learning_rate=1e-2", "train.lr_scheduler='constant'", "lora.rank=8",
                                  "lora.dropout=0.0", "train.max_length=64", *overrides])


def _trainer(model_dir, out, *overrides, n_pairs=8):
    cfg = _cfg(model_dir, *overrides)
    model, tokenizer = load_causal_lm(cfg.model.name, device="cpu")
    rows = [p.to_trl() for p in arithmetic_pairs(n_pairs)]
    return build_trainer(TrainerInputs(model, tokenizer, rows, cfg, out)), tokenizer


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer("<|im_start|>user\nWhat is 3 + 11?<|im_end|>\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@pytest.fixture(scope="module")
def dpo_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo")
    trainer, tokenizer = _trainer(tiny_model_dir, out / "ckpt", "train.max_steps=8")
    train(trainer, None)
    nbytes = save_adapter(trainer, out / "adapter")
    return trainer, tokenizer, out, nbytes


def test_dpo_loss_starts_at_ln2_and_falls(dpo_run):
    losses = _losses(dpo_run[0])
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5)  # LoRA B = 0 at init: policy == reference
    assert sum(losses[-2:]) / 2 < losses[0] - 0.05, losses
    accs = [h["rewards/accuracies"] for h in dpo_run[0].state.log_history if "loss" in h]
    assert accs[-1] == 1.0


def test_saved_adapter_reproduces_trained_logits(dpo_run, tiny_model_dir):
    from peft import PeftModel
    trainer, tokenizer, out, nbytes = dpo_run
    files = sorted(p.name for p in (out / "adapter").iterdir())
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files
    assert 10_000 < nbytes < 200_000  # rank-8 LoRA on 7 projections of a 2-layer, 32-wide model, fp32
    base, _ = load_causal_lm(str(tiny_model_dir), device="cpu")
    reloaded = PeftModel.from_pretrained(base, str(out / "adapter"))
    trained = _logits(trainer.model, tokenizer)
    assert torch.allclose(_logits(reloaded, tokenizer), trained, atol=1e-6)
    with reloaded.disable_adapter():
        assert not torch.allclose(_logits(reloaded, tokenizer), trained, atol=1e-3)  # training moved the policy


def test_merged_folder_matches_adapter_model(dpo_run, tiny_model_dir, tmp_path):
    trainer, tokenizer, out, _ = dpo_run
    merged_dir = merge_adapter(str(tiny_model_dir), out / "adapter", tmp_path / "merged")
    merged, merged_tok = load_causal_lm(str(merged_dir), device="cpu")
    assert not any("lora" in k for k in merged.state_dict())
    assert torch.allclose(_logits(merged, merged_tok), _logits(trainer.model, tokenizer), atol=1e-5)


def test_ipo_and_orpo_first_step(tiny_model_dir, tmp_path):
    ipo, _ = _trainer(tiny_model_dir, tmp_path / "ipo", "train.loss='ipo'", "train.beta=0.1", "train.max_steps=1")
    ipo.train()
    # IPO at h = 0 (policy == reference): (0 - 1/(2 tau))^2 = 25 for tau = 0.1 (Azar et al. 2023, eq. 17)
    assert _losses(ipo)[0] == pytest.approx(25.0, rel=1e-5)
    orpo, _ = _trainer(tiny_model_dir, tmp_path / "orpo", "train.loss='orpo'", "train.beta=0.5",
                       "train.max_steps=1")
    orpo.train()
    log = next(h for h in orpo.state.log_history if "loss" in h)
    assert math.isfinite(log["loss"]) and log["loss"] not in (pytest.approx(math.log(2)), pytest.approx(25.0))
    # ORPO = NLL - lambda * mean log sigmoid(log odds ratio) (Hong et al. 2024, eq. 6): lambda reaches TRL
    assert log["loss"] == pytest.approx(log["nll_loss"] - 0.5 * log["log_odds_ratio"], rel=1e-4)


def test_precomputed_reference_gives_same_losses(tiny_model_dir, tmp_path):
    a, _ = _trainer(tiny_model_dir, tmp_path / "a", "train.max_steps=3")
    a.train()
    b, _ = _trainer(tiny_model_dir, tmp_path / "b", "train.max_steps=3", "train.precompute_ref_logprobs=true")
    b.train()
    assert _losses(b) == pytest.approx(_losses(a), abs=1e-5)


def test_resume_equals_uninterrupted(tiny_model_dir, tmp_path):
    full, _ = _trainer(tiny_model_dir, tmp_path / "full", "train.max_steps=4")
    full.train()
    first, _ = _trainer(tiny_model_dir, tmp_path / "r", "train.max_steps=2", "train.save_steps=2")
    assert resume_point(tmp_path / "r", resume=True) is None
    train(first, None)
    second, _ = _trainer(tiny_model_dir, tmp_path / "r", "train.max_steps=4", "train.save_steps=2")
    checkpoint = resume_point(tmp_path / "r", resume=True)
    assert checkpoint == str(tmp_path / "r" / "checkpoint-2") and resume_point(tmp_path / "r", False) is None
    train(second, checkpoint)
    assert _losses(second)[-2:] == pytest.approx(_losses(full)[-2:], abs=1e-5)


class _FakeApi:
    calls: list = []

    def __init__(self, token):
        self.calls.append(("init", token))

    def create_repo(self, **kw):
        self.calls.append(("create_repo", kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw))
        return type("Info", (), {"commit_url": "https://hub/commit/1"})()


def test_push_reads_token_from_env_only(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="HF_TOKEN"):
        push_folder(tmp_path, "me/model", api_factory=_FakeApi)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    _FakeApi.calls = []
    res = push_folder(tmp_path, "me/model", private=True, api_factory=_FakeApi)
    assert _FakeApi.calls[0] == ("init", "hf_secret_value")
    assert _FakeApi.calls[1] == ("create_repo", {"repo_id": "me/model", "private": True, "exist_ok": True})
    assert _FakeApi.calls[2][1]["folder_path"] == str(tmp_path) and res.url == "https://hub/commit/1"
    assert "hf_secret_value" not in capsys.readouterr().out + repr(res)
