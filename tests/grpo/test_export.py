"""`grpo export`: the checkpointed LoRA policy merged into a plain folder gives the trained policy's logits."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from scalelab.grpo.checkpoint import CheckpointError, load_trainable
from scalelab.core.gguf_cache import sha256_file
from scalelab.grpo.export import RECORD, RUN_RECORD, export_run
from scalelab.grpo.parts import prepare_policy
from scalelab.grpo.train import train
from tests.grpo.test_train import make
from tests.grpo.tiny import tiny_llama, tiny_tokenizer


def test_exported_folder_reproduces_the_trained_lora_policy(tmp_path):
    cfg, parts = make(tmp_path, "run", "model.lora.r=4", "optim.lr=5e-2", "train.max_steps=2")
    train(cfg, parts, log=lambda s: None)
    rec = export_run(tmp_path / "run", tmp_path / "out", torch.float32, (tiny_llama(seed=0), tiny_tokenizer()))
    assert rec.weights_version == 2 and rec.lora_merged
    assert json.loads((tmp_path / "out" / RECORD).read_text())["safetensors_sha256"] == \
        sha256_file(tmp_path / "out" / "model.safetensors")
    # the run folder keeps the record too, with where the weights went (they do not travel with the results)
    kept = json.loads((tmp_path / "run" / RUN_RECORD).read_text())
    assert kept["safetensors_sha256"] == rec.safetensors_sha256 and kept["out"] == str(tmp_path / "out")
    assert kept["weights_version"] == 2
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    trained, _ = prepare_policy(tiny_llama(seed=0), cfg)
    load_trainable(tmp_path / "run" / "checkpoint.json", trained)
    base = tiny_llama(seed=0).eval()
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        want, got, before = trained.eval()(ids).logits, exported(ids).logits, base(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert (want - before).abs().max() > 1e-3  # the adapters had moved: the check above could fail


def test_a_run_without_checkpoint_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="checkpoint.json: not found"):
        export_run(tmp_path / "empty", tmp_path / "out")
