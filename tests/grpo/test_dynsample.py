"""dynsample: a step rolls out more prompts' groups than it trains on and keeps those whose rewards differ (DAPO's
dynamic sampling in one pass); the choice by hand, then in the loop on a tiny random Llama."""
from __future__ import annotations

import pytest
import torch

from scalelab.core.config import ConfigError, load_config
from scalelab.grpo.config import GrpoConfig, generated_prompts
from scalelab.grpo.dynsample import choose_groups, selection, take_groups
from scalelab.grpo.types import RolloutBatch


def test_prompts_rolled_out():
    assert [generated_prompts(32, o) for o in (1.0, 1.5, 1.2, 2.0)] == [32, 48, 39, 64]
    assert generated_prompts(2, 1.01) == 3


def test_groups_with_a_signal_come_first_then_the_rest_fill_in_order():
    # four groups of two: (1, 0) differs, (1, 1) does not, (0, 0) does not, (0, 1) differs
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    assert choose_groups(r, 2, 2) == [0, 3]
    assert choose_groups(r, 2, 3) == [0, 1, 3]   # one without a signal, the first of them, fills the third place
    assert choose_groups(r, 2, 1) == [0]
    s = selection(r, 2, 2)
    assert (s.generated_groups, s.generated_zero_signal_frac, s.kept) == (4, 0.5, (0, 3))


def test_take_groups_keeps_each_groups_rows_together_and_in_order():
    n = 6  # three groups of two
    batch = RolloutBatch(tuple((i,) for i in range(n)), tuple((10 + i,) for i in range(n)),
                         tuple(f"t{i}" for i in range(n)), tuple((-float(i),) for i in range(n)),
                         tuple(i % 2 == 0 for i in range(n)), 5.0, 3, "hf")
    kept = take_groups(batch, [0, 2], 2)
    assert kept.texts == ("t0", "t1", "t4", "t5") and kept.completion_ids == ((10,), (11,), (14,), (15,))
    assert kept.logprobs == ((-0.0,), (-1.0,), (-4.0,), (-5.0,)) and kept.finished == (True, False, True, False)
    assert (kept.generation_ms, kept.weights_version) == (5.0, 3)


def test_oversample_below_one_is_refused():
    with pytest.raises(ConfigError, match="data.oversample"):
        load_config(GrpoConfig, None, ["data.oversample=0.5"])


def test_the_loop_trains_on_the_groups_with_a_signal(tmp_path):
    """Even examples pay 1.0 to every answer (no signal), odd ones the parity of the answer's characters (a
    signal in nearly every group): each step rolls out 4 prompts, trains on 2, odd ones first."""
    from tests.grpo.test_train import make, steps
    from scalelab.grpo.train import train
    cfg, parts = make(tmp_path, "dyn", "model.lora.r=4", "train.max_steps=4", "data.oversample=2.0")

    def reward(texts, exs):
        return [1.0 if int(e.id) % 2 == 0 else float(sum(map(ord, t)) % 2) for t, e in zip(texts, exs)]
    parts = type(parts)(parts.policy, parts.tokenizer, parts.examples, [("mixed", 1.0, reward)], parts.reference)
    train(cfg, parts, log=lambda s: None)
    recs = steps(tmp_path, "dyn")
    assert len(recs) == 4
    for r in recs:
        assert r["generated_groups"] == 4 and len(r["example_ids"]) == 2 and len(r["completion_lengths"]) == 16
        odd_rolled_out = round(4 * (1 - r["generated_zero_signal_frac"]))
        odd_kept = sum(int(i) % 2 for i in r["example_ids"])
        assert odd_kept == min(2, odd_rolled_out), r
        assert r["zero_signal_frac"] == pytest.approx((2 - odd_kept) / 2)
        # the rollout's tokens are every generated sequence's; the trained ones are the kept groups'
        assert r["rollout_tokens"] == r["generated_tokens_this_step"] >= sum(r["completion_lengths"])
    assert any(r["generated_zero_signal_frac"] > r["zero_signal_frac"] for r in recs)


def test_the_prior_prices_the_extra_rollout_and_not_the_update():
    """Oversampling by 2 doubles the sequences the rollout makes; the update still trains on P groups. With the
    decode step overhead at 0 a decode is bound by bytes per step, so twice the rows cost twice the time only
    through the prefill and the tokens: the update and reference times stay put."""
    from scalelab.grpo.telemetry import predict_step
    from tests.grpo.tiny import tiny_llama
    model = tiny_llama()
    base = ['run.gpu="h200"', "data.prompts_per_step=4", "rollout.group_size=8", "predict.decode_step_overhead_ms=0"]
    one = predict_step(load_config(GrpoConfig, None, base), model, 16.0, "cuda")
    two = predict_step(load_config(GrpoConfig, None, [*base, "data.oversample=2.0"]), model, 16.0, "cuda")
    assert two["step"]["update_ms"] == one["step"]["update_ms"]
    assert two["step"]["reference_ms"] == one["step"]["reference_ms"]
    assert two["prefill_ms"] == pytest.approx(2 * one["prefill_ms"])
    assert two["step"]["rollout_ms"] > one["step"]["rollout_ms"]
    assert two["sequences_per_step"] == one["sequences_per_step"] == 32
