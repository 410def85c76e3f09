"""The update's forward passes: micro-batches grouped by length, the input cropped to each group, and the LM head
applied to completion positions only, a chunk at a time. Each must give the plain full-frame computation's
log-probs, entropies and gradients."""
from __future__ import annotations

import pytest
import torch

from scalelab.grpo.advantages import token_entropy, token_logprobs
from scalelab.grpo.batch import Micro, body_and_head, frame_logprobs_entropy, frozen_logprobs, micro_batches
from scalelab.grpo.checkpoint import trainable_state
from scalelab.grpo.head import head_logprobs
from scalelab.grpo.train import optimizer_step
from tests.bench_script import load_bench
from tests.grpo.test_train import _step_tensors, make


def _full_frame(model, t, temperature):
    """The reference computation: every frame position's logits of the whole padded batch."""
    out = model(input_ids=t.input_ids, attention_mask=t.attention_mask, logits_to_keep=t.keep, use_cache=False)
    logits = out.logits[:, :-1]
    return token_logprobs(logits, t.targets, temperature) * t.mask, token_entropy(logits, temperature) * t.mask


def _tensors(tmp_path, *overrides):
    cfg, parts = make(tmp_path, "b", "model.lora.enabled=false", "optim.grad_clip=0", *overrides)
    return cfg, parts, _step_tensors(cfg, parts)


def test_token_budget_groups_longest_first_and_respects_both_caps(tmp_path):
    _, _, t = _tensors(tmp_path)
    lengths = t.attention_mask.sum(1).tolist()
    for rows, tokens in ((12, 0), (5, 0), (12, 40), (3, 25)):
        micros = micro_batches(t, rows, tokens)
        seen = sorted(i for m in micros for i in m.rows.tolist())
        assert seen == list(range(t.n))  # every row exactly once
        for m in micros:
            ls = [lengths[i] for i in m.rows.tolist()]
            assert m.length == max(ls) and len(ls) <= rows
            assert m.width == m.length - (t.input_ids.shape[1] - (t.keep - 1))
            if tokens:
                assert len(ls) == 1 or len(ls) * max(ls) <= tokens
        if tokens:  # sorted: each pass's rows are no longer than the previous pass's
            flat = [lengths[i] for m in micros for i in m.rows.tolist()]
            assert flat == sorted(flat, reverse=True)
        else:  # fixed slices in rollout order
            assert [i for m in micros for i in m.rows.tolist()] == list(range(t.n))


@pytest.mark.parametrize("split", [True, False])
def test_cropped_micro_batches_and_the_chunked_head_match_the_full_frame(tmp_path, split):
    _, parts, t = _tensors(tmp_path)
    model = parts.policy.eval() if split else load_bench("grpo_update_bench").LogitsOnly(parts.policy.eval())
    assert (body_and_head(model) is not None) == split
    with torch.no_grad():
        want_lp, want_ent = _full_frame(model, t, 0.7)
        assert float(t.mask.sum()) > 10  # enough completion tokens to mean something
        for micros in (micro_batches(t, 12), micro_batches(t, 4, 30)):
            got_lp = torch.zeros_like(want_lp)
            got_ent = torch.zeros_like(want_ent)
            for m in micros:
                lp, ent = frame_logprobs_entropy(model, t, m, 0.7, entropy=True, head_rows=3)
                got_lp[m.rows, :m.width], got_ent[m.rows, :m.width] = lp, ent
            torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_ent, want_ent, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(frozen_logprobs(model, t, 0.7, micros, False), want_lp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_head_chunks_give_the_unchunked_gradient(bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 11, bias=bias)
    h = torch.randn(7, 6, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    grads = []
    for rows in (7, 2):  # one chunk vs four (each recomputed in the backward)
        head.zero_grad()
        h.grad = None
        lp, ent = head_logprobs(head, h, targets, 1.3, rows, entropy=True)
        (lp * torch.arange(7.0)).sum().backward()
        grads.append((h.grad.clone(), head.weight.grad.clone(), lp.detach(), ent,
                      head.bias.grad.clone() if bias else torch.zeros(())))
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b)
    head.zero_grad()  # autograd through the plain formula: the recomputing backward's gradients must equal it
    h.grad = None
    want = torch.log_softmax(head(h) / 1.3, -1).gather(1, targets[:, None]).squeeze(1)
    (want * torch.arange(7.0)).sum().backward()
    torch.testing.assert_close(grads[0][2], want.detach())
    torch.testing.assert_close(grads[0][0], h.grad)
    torch.testing.assert_close(grads[0][1], head.weight.grad)
    if bias:
        torch.testing.assert_close(grads[0][4], head.bias.grad)
    p = torch.softmax(head(h).detach() / 1.3, -1)
    torch.testing.assert_close(grads[1][3], -(p * p.log()).sum(-1))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_a_token_budget_changes_no_gradient(tmp_path, aggregation):
    deltas = []
    for setting in ("optim.micro_batch_tokens=0", "optim.micro_batch_tokens=30"):
        cfg, parts, t = _tensors(tmp_path, "optim.micro_batch_size=12", setting, f"loss.aggregation={aggregation}")
        if setting.endswith("=30"):
            assert len(micro_batches(t, 12, 30)) > 2  # the budget really splits the step
        opt = torch.optim.SGD(parts.policy.parameters(), lr=1.0)
        before = trainable_state(parts.policy)
        optimizer_step(parts.policy, t, opt, cfg, None, None, first=True)
        deltas.append({k: v - before[k] for k, v in trainable_state(parts.policy).items()})
    assert any(deltas[0][k].abs().max() > 0 for k in deltas[0])
    for k in deltas[0]:
        torch.testing.assert_close(deltas[0][k], deltas[1][k], atol=1e-6, rtol=1e-5)


def test_a_micro_batch_takes_its_rows_and_columns():
    x = torch.arange(12.0).view(3, 4)
    m = Micro(torch.tensor([2, 0]), length=5, width=2)
    assert m.take(x).tolist() == [[8.0, 9.0], [0.0, 1.0]]


def test_the_step_record_counts_the_update_tokens_and_their_padding(tmp_path):
    from scalelab.grpo.train import train
    from tests.grpo.test_train import steps
    for name, budget in (("fixed", 0), ("budget", 30)):
        cfg, parts = make(tmp_path, name, "model.lora.r=4", "train.max_steps=1", "optim.micro_batch_size=4",
                          f"optim.micro_batch_tokens={budget}")
        train(cfg, parts, log=lambda s: None)
        (rec,) = steps(tmp_path, name)
        n = len(rec["completion_lengths"])
        # every row's prompt (>= 1 token) and completion passes through the forward once; padding only adds
        assert rec["update_tokens"] >= sum(rec["completion_lengths"]) + n
        assert rec["update_padded_tokens"] >= rec["update_tokens"]


def test_skipping_zero_signal_groups_rescales_the_gradient_and_nothing_else(tmp_path):
    """At kl_coef 0 a group of equal rewards has advantage 0 and no gradient: leaving it out changes the
    token-mean's denominator only, so the step is the full one times all tokens / kept tokens."""
    from scalelab.grpo.advantages import Normalizer, group_advantages
    from scalelab.grpo.train import signal_rows
    cfg, parts, t = _tensors(tmp_path, "optim.micro_batch_size=5", "loss.kl_coef=0")
    rewards = torch.tensor([1.0] * 4 + [0.0, 1.0, 0.0, 0.0] + [0.0, 0.0, 2.0, 1.0])  # group 0: no signal
    assert signal_rows(rewards, 4) == list(range(4, 12))
    assert sorted(i for m in micro_batches(t, 5, 0, signal_rows(rewards, 4)) for i in m.rows.tolist()) == list(
        range(4, 12))
    t = collate_like(t, group_advantages(rewards, 4))
    all_tokens, kept_tokens = float(t.mask.sum()), float(t.mask[4:].sum())
    deltas = []
    for rows, tokens in ((None, all_tokens), (signal_rows(rewards, 4), kept_tokens)):
        _, parts, _ = _tensors(tmp_path, "optim.micro_batch_size=5")  # the same initial weights
        opt = torch.optim.SGD(parts.policy.parameters(), lr=1.0)
        before = trainable_state(parts.policy)
        norm = Normalizer(t.n if rows is None else len(rows), int(tokens), cfg.rollout.max_new_tokens)
        optimizer_step(parts.policy, t, opt, cfg, None, None, first=True, norm=norm,
                       micros=micro_batches(t, 5, 0, rows))
        deltas.append({k: v - before[k] for k, v in trainable_state(parts.policy).items()})
    assert any(deltas[0][k].abs().max() > 0 for k in deltas[0])
    for k in deltas[0]:
        torch.testing.assert_close(deltas[1][k], deltas[0][k] * (all_tokens / kept_tokens), atol=1e-6, rtol=1e-4)


def collate_like(t, advantages):
    from dataclasses import replace
    return replace(t, advantages=advantages)


def test_a_step_whose_groups_all_lack_signal_still_steps_cleanly(tmp_path):
    from scalelab.grpo.train import train
    from tests.grpo.test_train import steps
    # a reward no completion can earn: every group is all zeros, every row is skipped
    cfg, parts = make(tmp_path, "none", "model.lora.r=4", "train.max_steps=2", "loss.skip_zero_signal=true")
    never = [("never", 1.0, lambda texts, exs: [0.0] * len(texts))]
    parts = type(parts)(parts.policy, parts.tokenizer, parts.examples, never, parts.reference)
    before = trainable_state(parts.policy)
    train(cfg, parts, log=lambda s: None)
    recs = steps(tmp_path, "none")
    assert [r["update_tokens"] for r in recs] == [0, 0] and all(r["zero_signal_frac"] == 1.0 for r in recs)
    assert all(torch.equal(v, before[k]) for k, v in trainable_state(parts.policy).items())
