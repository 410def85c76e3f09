"""Implicit-reward margins: response-only log-probs against a position-by-position hand computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scalelab.dpo.margins import (MarginCallback, margin_stats, pair_batch, plot_margins, sequence_logps,
                                  tokenize_pair)
from tests.dpo.conftest import arithmetic_pairs, make_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _hand_logp(model, ids: list[int], first_response: int) -> float:
    """sum_t log p(ids[t] | ids[:t]) for t >= first_response, one unpadded forward per position."""
    total = 0.0
    with torch.no_grad():
        for t in range(first_response, len(ids)):
            logits = model(input_ids=torch.tensor([ids[:t]])).logits[0, -1].double()
            total += float(torch.log_softmax(logits, -1)[ids[t]])
    return total


def test_tokenize_pair_splits_prompt_and_response(tokenizer):
    pair = arithmetic_pairs(1)[0].to_trl()
    t = tokenize_pair(tokenizer, pair)
    rendered = tokenizer.apply_chat_template(pair["prompt"], tokenize=False, add_generation_prompt=True)
    assert list(t.prompt_ids) == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(t.chosen_ids) == "The answer is 14.<|im_end|>\n"
    assert tokenizer.decode(t.rejected_ids) == "The answer is 15.<|im_end|>\n"


def test_sequence_logps_sum_response_tokens_only(tokenizer):
    model = make_tiny_model(tokenizer, seed=3)
    pairs = [tokenize_pair(tokenizer, p.to_trl()) for p in arithmetic_pairs(2, wrong_offset=100)]
    batch = pair_batch(pairs, tokenizer.pad_token_id, max_length=256)
    logps, counts = sequence_logps(model, batch)
    rows = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
    expected = [_hand_logp(model, list(pr) + list(resp), len(pr)) for pr, resp in rows]
    assert counts.tolist() == [len(resp) for _, resp in rows]
    assert logps.tolist() == pytest.approx(expected, abs=1e-4)
    assert batch["input_ids"].shape[0] == 4 and batch["completion_mask"].sum() == sum(counts.tolist())


def test_margin_stats_by_hand():
    pol = (np.array([-1.0, -2.0, -3.0]), np.array([-2.0, -2.0, -5.0]))
    ref = (np.array([-1.5, -2.0, -2.0]), np.array([-1.5, -1.0, -5.0]))
    s = margin_stats(7, 0.5, pol, ref, chosen_tokens=np.array([1, 2, 4]), bins=4)
    # r_c = 0.5*[0.5, 0, -1] = [0.25, 0, -0.5]; r_r = 0.5*[-0.5, -1, 0] = [-0.25, -0.5, 0]; m = [0.5, 0.5, -0.5]
    assert s.margin_mean == pytest.approx(1 / 6)
    assert s.margin_std == pytest.approx(math.sqrt(2 / 9))
    assert s.reward_accuracy == pytest.approx(2 / 3)
    assert s.chosen_reward_mean == pytest.approx(-0.25 / 3) and s.rejected_reward_mean == pytest.approx(-0.25)
    assert s.drift_abs_logratio_chosen_nats == pytest.approx(0.5)
    assert s.drift_abs_logratio_chosen_nats_per_token == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert s.hist_counts == [1, 0, 0, 2] and s.hist_edges[0] == -0.5 and s.hist_edges[-1] == 0.5


def test_callback_rewards_match_hand_computation(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    base_copy = make_tiny_model(tokenizer, seed=5)
    peft_model = get_peft_model(make_tiny_model(tokenizer, seed=5),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))  # random B: policy != reference
    pairs = [p.to_trl() for p in arithmetic_pairs(3)]
    records = []
    cb = MarginCallback(pairs, tokenizer, beta=0.2, log=lambda event, **f: records.append({"event": event, **f}),
                        every_steps=1, bins=5, batch_pairs=2)
    stats = cb.evaluate(peft_model, step=0)
    margins = []
    for p in pairs:
        t = tokenize_pair(tokenizer, p)
        lp = {side: _hand_logp(m, list(t.prompt_ids) + list(getattr(t, side)), len(t.prompt_ids))
              for side in ("chosen_ids", "rejected_ids") for m in [peft_model]}
        ref = {side: _hand_logp(base_copy, list(t.prompt_ids) + list(getattr(t, side)), len(t.prompt_ids))
               for side in ("chosen_ids", "rejected_ids")}
        margins.append(0.2 * ((lp["chosen_ids"] - ref["chosen_ids"]) - (lp["rejected_ids"] - ref["rejected_ids"])))
    assert stats.margin_mean == pytest.approx(np.mean(margins), abs=1e-4)
    assert stats.reward_accuracy == pytest.approx(np.mean(np.array(margins) > 0))
    assert abs(stats.margin_mean) > 1e-4  # the adapter really changed the policy
    assert records[0]["event"] == "margins" and sum(records[0]["hist_counts"]) == 3
    assert plot_margins(records, tmp_path / "m.png").stat().st_size > 1000
