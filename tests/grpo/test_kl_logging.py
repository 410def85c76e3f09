"""KL to the reference, the policy's entropy and the clip fraction are measured every step even at kl_coef = 0;
the budget stop ends a launch with a checkpoint that the next launch continues; the gated format reward."""
from __future__ import annotations

import math

import pytest
import torch

from scalelab.evals.rewards import format_gated_reward, format_reward
from scalelab.evals.tasks import Example
from scalelab.grpo.advantages import group_advantages, token_entropy
from scalelab.grpo.train import train
from tests.grpo.test_train import make, steps


def test_kl_is_logged_at_kl_coef_zero_with_lora(tmp_path):
    cfg, parts = make(tmp_path, "kl", "model.lora.r=4", "optim.lr=5e-2", "train.max_steps=3", "loss.kl_coef=0")
    train(cfg, parts, log=lambda s: None)
    recs = steps(tmp_path, "kl")
    # LoRA starts with B = 0, so at step 0 the policy is the reference: KL exactly 0; after an update it is not
    assert recs[0]["kl_mean"] == 0.0
    assert recs[2]["kl_mean"] > 1e-6
    assert all(r["reference_ms"] > 0 for r in recs)  # the reference pass ran (and was timed) every step
    vocab = parts.policy.config.vocab_size
    for r in recs:
        assert 0.0 < r["entropy_mean"] <= math.log(vocab) + 1e-6
        assert 0.0 <= r["clip_frac"] <= 1.0


def test_without_log_kl_there_is_no_reference_pass(tmp_path):
    cfg, parts = make(tmp_path, "nokl", "model.lora.r=4", "train.max_steps=1", "loss.log_kl=false")
    train(cfg, parts, log=lambda s: None)
    (rec,) = steps(tmp_path, "nokl")
    assert rec["reference_ms"] == 0.0 and rec["kl_mean"] == 0.0


def test_full_weight_training_keeps_a_frozen_reference_for_the_log(tmp_path):
    cfg, parts = make(tmp_path, "full", "model.lora.enabled=false", "optim.lr=5e-3", "train.max_steps=6")
    assert parts.reference is not None and not any(p.requires_grad for p in parts.reference.parameters())
    train(cfg, parts, log=lambda s: None)
    recs = steps(tmp_path, "full")
    assert recs[0]["kl_mean"] == pytest.approx(0.0, abs=1e-7)
    # the policy leaves the reference once a group had unequal rewards (a non-zero advantage)
    first = next(i for i, r in enumerate(recs) if r["adv_abs_mean"] > 0)
    assert first < 5 and all(r["kl_mean"] > 1e-9 for r in recs[first + 1:])


def test_entropy_of_a_uniform_and_a_peaked_distribution():
    uniform = torch.zeros(1, 1, 8)
    assert float(token_entropy(uniform)) == pytest.approx(math.log(8))
    peaked = torch.tensor([[[10.0, 0.0]]])  # p = (1 - e, e), e = 1 / (1 + e^10)
    e = 1 / (1 + math.exp(10))
    assert float(token_entropy(peaked)) == pytest.approx(-(1 - e) * math.log(1 - e) - e * math.log(e), rel=1e-3)
    # temperature 2 halves the logits: p = (1 - e2, e2), e2 = 1 / (1 + e^5)
    e2 = 1 / (1 + math.exp(5))
    assert float(token_entropy(peaked, 2.0)) == pytest.approx(-(1 - e2) * math.log(1 - e2) - e2 * math.log(e2),
                                                              rel=1e-3)


def test_budget_stop_checkpoints_and_the_next_launch_finishes(tmp_path):
    cfg, parts = make(tmp_path, "budget", "model.lora.r=4", "train.max_steps=3", "train.budget_s=1e-9")
    train(cfg, parts, log=lambda s: None)
    assert [r["step"] for r in steps(tmp_path, "budget")] == [0]  # stopped after the first step
    assert (tmp_path / "budget" / "checkpoint.json").is_file()
    cfg, parts = make(tmp_path, "budget", "model.lora.r=4", "train.max_steps=3", "train.budget_s=0")
    train(cfg, parts, log=lambda s: None)
    assert [r["step"] for r in steps(tmp_path, "budget")] == [0, 1, 2]


def _gsm(answer: str) -> Example:
    return Example("gsm8k", "g/0", [], answer, {"prompt_format": "qwen_boxed"})


def test_format_is_paid_only_with_a_right_answer():
    completions = ["so \\boxed{18}", "so \\boxed{17}", "it is 18", "no number"]
    examples = [_gsm("18")] * 4
    assert format_reward(completions, examples) == [1.0, 1.0, 0.0, 0.0]
    assert format_gated_reward(completions, examples) == [1.0, 0.0, 0.0, 0.0]


def test_group_std_scaling_turns_a_format_only_difference_into_a_full_advantage():
    # the collapse mechanism: a group with no right answer, one completion well-formed (0.1 x format)
    format_only = group_advantages(torch.tensor([0.1] + [0.0] * 7), 8, "group_std")
    right_answer = group_advantages(torch.tensor([1.1] + [0.0] * 7), 8, "group_std")
    assert float(format_only[0]) == pytest.approx(float(right_answer[0]), rel=1e-2)  # the same pull
    assert float(format_only[0]) > 2.0  # 7 / sqrt(7) = 2.65 with the unbiased std
    # gated, the group has equal rewards and teaches nothing
    assert torch.all(group_advantages(torch.zeros(8), 8, "group_std") == 0)
