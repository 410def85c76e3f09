"""Advantages, the clipped loss, k3 KL, truncated IS and aggregation on hand-computed numbers."""
from __future__ import annotations

import math

import pytest
import torch

from scalelab.grpo.advantages import (LossSettings, Normalizer, aggregate, clipped_surrogate, group_advantages,
                                      grpo_loss, k3_kl, token_logprobs, truncated_is_weight, zero_signal_fraction)


def test_group_advantages_divide_by_bessel_std():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    # group 1: mean 0.25, sum of squared deviations 0.75, /(G-1)=0.25, std 0.5
    # group 2: mean 0.5, squared deviations 1.0, /3, std sqrt(1/3)
    s = math.sqrt(1 / 3)
    expected = [1.5, -0.5, -0.5, -0.5, 0.5 / s, 0.5 / s, -0.5 / s, -0.5 / s]
    assert group_advantages(r, 4, "group_std", eps=0.0).tolist() == pytest.approx(expected, abs=1e-6)


def test_dr_grpo_advantages_are_only_centred():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    assert group_advantages(r, 4, "none").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])


def test_equal_rewards_give_zero_advantage_and_count_as_no_signal():
    r = torch.tensor([2.0, 2, 2, 0, 1, 0])
    assert group_advantages(r, 3).tolist()[:3] == [0.0, 0.0, 0.0]
    assert zero_signal_fraction(r, 3) == 0.5
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(r, 4)


def test_clipped_surrogate_hand_values():
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]])
    adv_per_token = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    # one sequence per column so each token gets its own advantage
    logp, old = torch.log(ratios).T, torch.zeros(5, 1)
    loss, clipped = clipped_surrogate(logp, old, adv_per_token, 0.2, 0.2)
    # +A, r=1.5 -> min(1.5, 1.2); +A, r=0.5 -> min(0.5, 0.8); -A, r=1.5 -> min(-1.5, -1.2); -A, r=0.5 -> min(-0.5, -0.8)
    assert loss.squeeze(1).tolist() == pytest.approx([-1.2, -0.5, 1.5, 0.8, -2.2], abs=1e-6)
    assert clipped.squeeze(1).tolist() == [True, False, False, True, False]
    loss_hi, _ = clipped_surrogate(logp[:1], old[:1], adv_per_token[:1], 0.2, 0.28)  # DAPO clip-higher
    assert loss_hi.item() == pytest.approx(-1.28, abs=1e-6)


def test_k3_kl_hand_value_and_zero_at_equal():
    logp, ref = torch.log(torch.tensor([0.5, 0.5])), torch.log(torch.tensor([0.25, 0.5]))
    # r = p_ref/p = 0.5: (r - 1) - log r = -0.5 + 0.693147
    assert k3_kl(logp, ref).tolist() == pytest.approx([0.193147, 0.0], abs=1e-6)


def test_truncated_is_weight():
    old, behavior = torch.log(torch.tensor([0.3, 0.9, 0.4])), torch.log(torch.tensor([0.6, 0.3, 0.4]))
    assert truncated_is_weight(old, behavior, cap=2.0).tolist() == pytest.approx([0.5, 2.0, 1.0], abs=1e-6)


def test_token_logprobs_apply_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    # softmax([1, 0]) at T=2: e / (e + 1)
    assert token_logprobs(logits, torch.tensor([[0]]), 2.0).item() == pytest.approx(math.log(math.e / (math.e + 1)))


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
NORM = Normalizer(sequences=2, tokens=4, max_new_tokens=3)


@pytest.mark.parametrize("how,expected", [("token_mean", 10 / 4), ("seq_mean", (6 / 3 + 4 / 1) / 2),
                                          ("seq_sum_norm", 10 / (2 * 3))])
def test_aggregation_hand_values_and_micro_batch_sum(how, expected):
    assert aggregate(PER_TOKEN, MASK, how, NORM).item() == pytest.approx(expected)
    halves = aggregate(PER_TOKEN[:1], MASK[:1], how, NORM) + aggregate(PER_TOKEN[1:], MASK[1:], how, NORM)
    assert halves.item() == pytest.approx(expected)  # accumulation over micro-batches == the full batch


def test_grpo_loss_value_and_gradient_with_kl():
    logp = torch.log(torch.full((2, 2), 0.5)).requires_grad_()
    ref = torch.log(torch.full((2, 2), 0.25))
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    s = LossSettings(kl_coef=0.1, aggregation="token_mean")
    terms = grpo_loss(logp, logp.detach(), adv, mask, Normalizer(2, 4, 2), s, ref_logp=ref)
    # policy terms -A*1 cancel across the two sequences; 4 tokens of 0.1 * 0.193147, over 4 tokens
    assert terms.loss.item() == pytest.approx(0.1 * 0.193147, abs=1e-6)
    assert terms.kl_sum == pytest.approx(4 * 0.193147, abs=1e-5)
    terms.loss.backward()
    # d/dlogp: -A * ratio / 4 + beta * (1 - p_ref/p) / 4 = -0.25 + 0.0125 for A=+1
    assert logp.grad[0].tolist() == pytest.approx([-0.2375, -0.2375], abs=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([0.2625, 0.2625], abs=1e-6)


def test_grpo_loss_is_weights_scale_the_policy_term():
    logp = torch.zeros(1, 2, requires_grad=True)
    behavior = torch.log(torch.tensor([[0.5, 0.25]]))  # w = min(1/0.5, 3) = 2, min(1/0.25, 3) = 3 (truncated)
    terms = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), Normalizer(1, 2, 2),
                      LossSettings(is_cap=3.0), behavior_logp=behavior)
    assert terms.loss.item() == pytest.approx(-(2 + 3) / 2)
    assert (terms.is_weight_sum, terms.is_truncated_tokens) == (pytest.approx(5.0), 1.0)
