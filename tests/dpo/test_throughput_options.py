"""train.packing and the in-memory reference precompute: same log-probs, gradients and DPO losses as TRL's padded
path; the packing plan on hand-computed rows; bench/dpo_throughput.py --tiny end to end."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.core.config import ConfigError
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.packing import Block, plan_rows
from tests.dpo.conftest import _tokenizer, arithmetic_pairs, make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# the plan


def test_padding_free_plan_packs_real_tokens_only():
    # rows (chosen 0, 1; rejected 2, 3) of real lengths 3, 2, 4, 1 in a width-4 padded batch
    plan = plan_rows([3, 2, 4, 1], row_len=4)
    assert plan.token_index.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11, 12]
    assert plan.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 0]
    # each packed position predicts the next token of its own row; a row's last token predicts nothing
    assert plan.label_index.tolist() == [1, 2, -1, 5, -1, 9, 10, 11, -1, -1]
    assert plan.gather_index.tolist() == [[0, 1, -1], [3, -1, -1], [5, 6, 7], [-1, -1, -1]]
    assert plan.blocks == (Block(0, 3), Block(3, 5), Block(5, 9), Block(9, 10))


def test_shared_prompt_plan_keeps_one_copy_of_the_prefix():
    # pair 0: chosen row 0 (5 tokens), rejected row 2 (6 tokens), 3 tokens in common -> the rejected row drops its
    # first 2 and attends to row 0's; pair 1: rows 1 (3) and 3 (4) share 2 -> row 3 drops 1 token
    plan = plan_rows([5, 3, 6, 4], row_len=6, shared=[3, 2])
    assert plan.n_tokens == 5 + 4 + 3 + 3
    assert plan.token_index.tolist() == [0, 1, 2, 3, 4, 14, 15, 16, 17, 6, 7, 8, 19, 20, 21]
    assert plan.position_ids.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 0, 1, 2, 1, 2, 3]
    assert plan.blocks == (Block(0, 5), Block(5, 9, 0, 2), Block(9, 12), Block(12, 15, 9, 10))
    # the rejected row's shared predictions come from the chosen row's positions (same context, same label)
    assert plan.gather_index[2].tolist() == [0, 1, 5, 6, 7]
    assert plan.gather_index[3].tolist() == [9, 12, 13, -1, -1]


def test_shared_prompt_plan_needs_two_shared_tokens_and_a_tail_in_each_row():
    one = plan_rows([3, 3], row_len=3, shared=[1])  # only the first token in common: nothing to save
    assert one.blocks == (Block(0, 3), Block(3, 6)) and one.n_tokens == 6
    # the chosen row is a prefix of the rejected one: the shared part is capped so each branch keeps a token
    prefix = plan_rows([3, 5], row_len=5, shared=[3])
    assert prefix.blocks == (Block(0, 3), Block(3, 7, 0, 1)) and prefix.n_tokens == 7
    assert prefix.gather_index[1].tolist() == [0, 3, 4, 5]


def test_batch_plan_reads_lengths_and_shared_prefixes_and_refuses_other_layouts():
    from scalelab.dpo.packing import batch_plan
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 9, 0, 0]])       # pair: chosen 5 6 7 8, rejected 5 6 9
    mask = (torch.arange(5) < torch.tensor([[4], [3]])).long()
    labels = ids.masked_fill(torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 1, 1]]).bool(), -100)  # prompt = 5 6
    plan = batch_plan(ids, mask, labels, share_prompt=True)
    assert plan.blocks == (Block(0, 4), Block(4, 6, 0, 1)) and plan.n_tokens == 6
    assert batch_plan(ids, mask, labels, share_prompt=False).n_tokens == 7
    assert batch_plan(ids, mask.flip(1), labels, share_prompt=False) is None    # left-padded: run padded
    assert batch_plan(ids, mask * torch.tensor([[1], [0]]), labels, share_prompt=False) is None  # an empty row


# ---------------------------------------------------------------------------------------------
# forward and backward against TRL's padded forward


def _fused_model_and_batch():
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.utils import add_fused_lm_head
    tok = _tokenizer()
    model = make_tiny_model(tok, seed=1).train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    examples = []
    for i, p in enumerate(arithmetic_pairs(3)):
        prompt = tok.apply_chat_template(p.prompt, add_generation_prompt=True, tokenize=False) + "x " * i
        examples.append({"prompt_ids": tok(prompt)["input_ids"],
                         "chosen_ids": tok(p.chosen[0]["content"] + " ok" * (2 - i))["input_ids"],
                         "rejected_ids": tok(p.rejected[0]["content"])["input_ids"]})
    batch = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(examples)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    return model, dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                       fused_lm_head=True, use_cache=False)


def _logps_and_grad(model, kw):
    model.zero_grad()
    out = model.forward(**kw)
    weights = torch.linspace(0.5, 1.5, out.log_probs.shape[1])  # any non-uniform weighting of the positions
    (out.log_probs * weights).sum().backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    return out.log_probs.detach(), out.entropy.detach(), out.is_top1, grad


@pytest.mark.parametrize("share_prompt", [False, True])
def test_packed_forward_equals_padded(share_prompt):
    from scalelab.dpo.packing import enable_packing
    model, kw = _fused_model_and_batch()
    logps, entropy, top1, grad = _logps_and_grad(model, kw)
    assert (logps != 0).sum() > 20  # completion tokens are scored
    enable_packing(model, share_prompt=share_prompt)
    p_logps, p_entropy, p_top1, p_grad = _logps_and_grad(model, kw)
    assert p_logps.shape == logps.shape
    assert torch.allclose(p_logps, logps, atol=1e-5) and torch.allclose(p_entropy, entropy, atol=1e-5)
    assert torch.equal(p_top1, top1)
    assert torch.allclose(p_grad, grad, atol=1e-5, rtol=1e-4)
    plain = model(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"]).logits  # not packed: sdpa
    assert plain.shape[:2] == kw["input_ids"].shape


# ---------------------------------------------------------------------------------------------
# through our trainer


def _losses(out_dir, *overrides):
    from scalelab.dpo.train import TrainerInputs, build_trainer
    tok = _tokenizer()
    cfg = load_dpo_config(None, ["model.device='cpu'", "train.batch_size=4", "train.learning_rate=1e-2",
                                 "train.lr_scheduler='constant'", "lora.rank=8", "lora.dropout=0.0",
                                 "train.max_length=64", "train.max_steps=3", *overrides])
    rows = [p.to_trl() for p in arithmetic_pairs(12)]
    trainer = build_trainer(TrainerInputs(make_tiny_model(tok), tok, rows, cfg, out_dir))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return [h["loss"] for h in logs], [h["rewards/margins"] for h in logs], trainer


def test_options_give_the_default_losses(monkeypatch, tmp_path):
    import scalelab.dpo.packing as packing
    plans = []
    real_plan_rows = packing.plan_rows
    monkeypatch.setattr(packing, "plan_rows", lambda *a, **k: plans.append(real_plan_rows(*a, **k)) or plans[-1])
    loss0, margin0, _ = _losses(tmp_path / "default")
    assert loss0[0] == pytest.approx(math.log(2), abs=1e-6) and abs(loss0[-1] - loss0[0]) > 1e-3  # it trains
    assert not plans  # the default path never packs
    for options in (["train.packing='padding_free'"], ["train.packing='shared_prompt'"],
                    ["train.packing='shared_prompt'", "train.precompute_ref_logprobs=true"],
                    ["train.packing='shared_prompt'", "train.gradient_checkpointing=true"]):
        plans.clear()
        loss, margin, trainer = _losses(tmp_path / "options", *options)
        assert loss == pytest.approx(loss0, abs=2e-6), options
        assert margin == pytest.approx(margin0, abs=2e-5), options
        assert plans, options  # the packed forward ran
        shared = any(b.has_prefix for p in plans for b in p.blocks)
        assert shared == ("train.packing='shared_prompt'" in options), options
    assert trainer.ref_precompute_s == 0.0
    _, _, pre = _losses(tmp_path / "pre", "train.precompute_ref_logprobs=true")
    assert pre.ref_precompute_s > 0 and "ref_chosen_logps" in pre.train_dataset.column_names


def test_packing_is_rejected_for_orpo():
    with pytest.raises(ConfigError, match="train.packing"):
        load_dpo_config(None, ["train.loss='orpo'", "train.packing='padding_free'"])


# ---------------------------------------------------------------------------------------------
# the bench, end to end on CPU


@pytest.mark.slow
def test_bench_tiny_runs_both_variants_at_equal_loss(tmp_path):
    out = tmp_path / "dpo_tiny.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dpo_throughput.py"), "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=170, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    d = json.loads(out.read_text())
    rows = d["summary"]["variants"]
    assert set(rows) == {"trl_default", "ours", "ours_shared_prompt"} and d["summary"]["passed"]
    assert d["summary"]["loss_noise_floor"] == 0.0 and d["summary"]["loss_tolerance"] == 1e-4
    for name in rows:
        t = rows[name]["throughput"]
        assert math.isfinite(t["tokens_per_s"]) and t["tokens_per_s"] > 0
        assert math.isfinite(t["tokens_per_s_end_to_end"]) and t["tokens_per_s_end_to_end"] > 0
    vs = rows["ours"]["vs_trl_default"]
    assert vs["equal_loss"] and vs["same_batches"] and vs["loss_max_abs_diff"] <= 1e-4
    assert vs["dpo_config_diff"]["gradient_checkpointing"] == [True, False]
    ours = next(r for r in d["results"] if r["name"] == "ours")
    packed = next(r for r in d["results"] if r["name"] == "ours_shared_prompt")
    assert packed["logps_check"]["max_abs_nats"] < 1e-3 and ours["ref_precompute_s"] == 0.0
    assert rows["ours_shared_prompt"]["vs_trl_default"]["loss_max_abs_diff"] <= 1e-4
    # the shared-prompt layout computes fewer tokens than the real ones, the padded layout more
    t = rows["ours"]["throughput"]
    assert t["tokens_per_s_end_to_end"] == t["tokens_per_s"]  # nothing precomputed: nothing to amortize
    assert t["shared_prompt_tokens_per_step"] < t["real_tokens_per_step"] < t["padded_tokens_per_step"]
    assert d["provenance"]["git_sha"] and "trl" in d["provenance"]["packages"]
    assert "PASSED" in proc.stdout
