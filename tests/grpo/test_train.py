"""The GRPO loop on a tiny random Llama: learning, resume == uninterrupted, staleness in the loop, grad
accumulation, LoRA weight export and sync."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.config import load_config
from scalelab.core.rundir import RunDir
from scalelab.grpo.advantages import group_advantages
from scalelab.grpo.batch import collate
from scalelab.grpo.checkpoint import trainable_state
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.engine_hf import HFGenerateEngine, build_hf
from scalelab.grpo.parts import Parts, prepare_policy
from scalelab.grpo.train import optimizer_step, train
from scalelab.grpo.types import EngineContext, SamplingParams
from scalelab.grpo.weightsync import sync_weights, write_model_folder
from tests.grpo.tiny import count_char, examples, tiny_llama, tiny_tokenizer

BASE = ["train.device=cpu", "data.prompts_per_step=2", "rollout.group_size=8", "rollout.max_new_tokens=6",
        "optim.micro_batch_size=16", "train.checkpoint_every=0"]


def make(tmp_path, name: str, *overrides: str) -> tuple[GrpoConfig, Parts]:
    cfg = load_config(GrpoConfig, None, [*BASE, f"run.out_dir={tmp_path}", f"run.name={name}", *overrides])
    policy, reference = prepare_policy(tiny_llama(seed=0), cfg)  # LoRA init is seeded by tiny_llama's seed
    return cfg, Parts(policy, tiny_tokenizer(), examples(), [("a", 1.0, count_char("a"))], reference)


def steps(tmp_path, name: str) -> list[dict]:
    return list(RunDir(tmp_path / name).events("grpo_step"))


def test_reward_paying_for_a_token_rises(tmp_path):
    cfg, parts = make(tmp_path, "learn", "model.lora.enabled=false", "optim.lr=5e-3", "train.max_steps=12")
    train(cfg, parts, log=lambda s: None)
    rewards = [s["reward_mean"] for s in steps(tmp_path, "learn")]
    # a random 47-token model emits 'a' ~2% of the time; GRPO with this reward makes it the usual token
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards
    # on-policy: the engine's behaviour log-probs are the trainer's own before each update
    assert all(s["behavior_logp_abs_diff"] < 1e-4 for s in steps(tmp_path, "learn"))
    assert (tmp_path / "learn" / "predictions.json").is_file()
    # every completion's length and reward value is kept, and agrees with the step's summaries
    for s in steps(tmp_path, "learn"):
        assert len(s["completion_lengths"]) == 16 and len(s["completion_rewards"]["a"]) == 16
        assert sum(s["completion_lengths"]) / 16 == pytest.approx(s["len_mean"])
        assert sum(s["completion_rewards"]["a"]) / 16 == pytest.approx(s["reward/a"], abs=1e-4)
        assert len(s["example_ids"]) == 2


RESUME = ["model.lora.r=4", "optim.lr=1e-2", "rollout.staleness=1", "loss.is_correction=true", "loss.kl_coef=0.05",
          "train.max_steps=4", "train.checkpoint_every=2"]


class Crash(Exception):
    pass


def crash_at(step: int):
    def log(line: str) -> None:
        if line.startswith(f"step {step:4d}"):
            raise Crash(line)
    return log


def test_resume_equals_uninterrupted_with_lora_staleness_and_kl(tmp_path):
    cfg, parts = make(tmp_path, "whole", *RESUME)
    train(cfg, parts, log=lambda s: None)
    whole = trainable_state(parts.policy)

    cfg, parts = make(tmp_path, "split", *RESUME)
    with pytest.raises(Crash):  # killed during step 2, after the checkpoint of step 1
        train(cfg, parts, log=crash_at(2))
    cfg, parts = make(tmp_path, "split", *RESUME)  # a fresh process: new model objects
    train(cfg, parts, log=lambda s: None)
    split = trainable_state(parts.policy)

    assert whole.keys() == split.keys() and all("lora_" in k for k in whole)
    assert all(torch.equal(whole[k], split[k]) for k in whole)
    untrained = trainable_state(make(tmp_path, "x", *RESUME)[1].policy)
    assert not all(torch.equal(whole[k], untrained[k]) for k in whole)
    recs = steps(tmp_path, "split")
    assert [r["step"] for r in recs] == [0, 1, 2, 2, 3]  # step 2 ran twice: before the crash and after resume
    assert [r["rollout_version"] for r in recs] == [0, 0, 1, 1, 2]  # staleness 1: step t used weights of t-1
    assert [r["rollout_version"] for r in steps(tmp_path, "whole")] == [0, 0, 1, 2]
    assert recs[-1]["kl_mean"] > 0 and recs[0]["kl_mean"] == 0  # adapters moved off the base after step 0
    # step 0 is on-policy; later batches are one update behind the weights that score them (step 1 only
    # when step 0's update moved the weights: here its 16 rewards were all equal, so it did not)
    diffs = [r["behavior_logp_abs_diff"] for r in steps(tmp_path, "whole")]
    assert diffs[0] < 1e-5 and min(diffs[2:]) > 1e-3, diffs
    assert recs[0]["zero_signal_frac"] == 1.0 and recs[1]["kl_mean"] < 1e-9
    assert RunDir(tmp_path / "split").read("results.json")["steps"] == 4
    assert [e["config_changed"] for e in RunDir(tmp_path / "split").events("resumed")] == [False]


def test_extending_a_stale_run_is_refused(tmp_path):
    cfg, parts = make(tmp_path, "short", *RESUME, "train.max_steps=2")
    train(cfg, parts, log=lambda s: None)
    cfg, parts = make(tmp_path, "short", *RESUME, "train.max_steps=4")
    with pytest.raises(ValueError, match=r"steps \[2\] were never generated"):
        train(cfg, parts, log=lambda s: None)
    assert [e["config_changed"] for e in RunDir(tmp_path / "short").events("resumed")] == [True]  # max_steps


def _step_tensors(cfg, parts):
    engine = HFGenerateEngine(parts.policy, parts.tokenizer, [1], ("shared",))
    prompts = [parts.tokenizer(f"{i}+1=?")["input_ids"] for i in range(3)]
    batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, seed=1))
    rewards = torch.tensor([float(c.count("a") + len(c) % 2) for c in batch.texts])
    return collate(batch, group_advantages(rewards, 4), 0, torch.device("cpu"))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(tmp_path, aggregation):
    results = []
    for micro in (12, 5):  # one pass vs 5 + 5 + 2
        cfg, parts = make(tmp_path, "ga", "model.lora.enabled=false", f"optim.micro_batch_size={micro}",
                          "optim.grad_clip=0", f"loss.aggregation={aggregation}")
        t = _step_tensors(cfg, parts)
        opt = torch.optim.SGD(parts.policy.parameters(), lr=1.0)
        before = trainable_state(parts.policy)
        optimizer_step(parts.policy, t, opt, cfg, None, None, first=True)
        results.append({k: v - before[k] for k, v in trainable_state(parts.policy).items()})
    assert all(torch.allclose(results[0][k], results[1][k], atol=1e-6) for k in results[0])
    assert any(results[0][k].abs().max() > 0 for k in results[0])


def _trained_lora(tmp_path):
    cfg, parts = make(tmp_path, "lora", "model.lora.r=4", "optim.lr=5e-2", "train.max_steps=2")
    train(cfg, parts, log=lambda s: None)
    return cfg, parts


def test_inplace_engine_copy_generates_like_the_shared_module(tmp_path):
    cfg, parts = _trained_lora(tmp_path)
    ctx = EngineContext(parts.policy, parts.tokenizer, cfg.rollout, 4, "inplace", tmp_path / "eng", 0)
    own = build_hf(ctx)
    assert not any("lora_" in n for n, _ in own.model.named_parameters())
    rec = sync_weights("inplace", parts.policy, own, 2, tmp_path / "sync")
    shared = HFGenerateEngine(parts.policy, parts.tokenizer, [1], ("shared",), 2)
    p = SamplingParams(n=4, max_new_tokens=8, seed=5)
    prompts = [parts.tokenizer("7+7=?")["input_ids"]]
    a, b = own.generate(prompts, p), shared.generate(prompts, p)
    assert a.completion_ids == b.completion_ids and a.weights_version == 2
    assert all(torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4) for x, y in zip(a.logprobs, b.logprobs))
    n_params = sum(q.numel() for q in own.model.parameters())
    assert rec.bytes == 4 * n_params and rec.method == "inplace"


def test_exported_folder_of_a_lora_policy_has_the_merged_weights(tmp_path):
    from transformers import AutoModelForCausalLM
    _, parts = _trained_lora(tmp_path)
    write_model_folder(parts.policy, parts.tokenizer, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    parts.policy.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, parts.policy(input_ids=ids).logits, atol=1e-5)
        with parts.policy.disable_adapter():
            assert not torch.allclose(loaded(ids).logits, parts.policy(input_ids=ids).logits, atol=1e-3)
