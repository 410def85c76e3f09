"""Muon (muon.py): the Newton-Schulz iteration against its scalar polynomial and its singular-value band, the
update rule by hand, the parameter split, and the trainer invariants with train.optimizer="muon": loss falls,
resume == uninterrupted, DDP / FSDP2 (2 gloo processes) == 1 process; config errors name their field."""
from __future__ import annotations

import math

import pytest
import torch

from scalelab.core.config import ConfigError
from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.muon import NS_COEFFS, Muon, newton_schulz, orthogonalize, shape_scale, split_params
from tests.pretrain.test_train_gpt import (TINY, VOCAB, data_dir, kill_and_resume, losses,  # noqa: F401
                                          make_cfg)

MUON = ["train.optimizer=\"muon\"", "optim.muon_lr=0.02"]


def p5(s: float, steps: int = 5) -> float:
    """The scalar map one Newton-Schulz step applies to every singular value, iterated."""
    a, b, c = NS_COEFFS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def test_newton_schulz_applies_the_quintic_to_singular_values():
    # an orthogonal 8x8 matrix has every singular value 1, so 1/sqrt(8) after the Frobenius normalization
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    expected = p5(8 ** -0.5)
    assert expected == pytest.approx(1.06697, abs=1e-4)  # 0.354 -> 0.946 -> 0.906 -> 0.977 -> 0.851 -> 1.067
    out = newton_schulz(q.float(), dtype=torch.float32)
    assert torch.allclose(out, expected * q.float(), atol=1e-5)
    assert p5(1.0, 1) == pytest.approx(0.701)  # a + b + c: the iteration does not converge to exactly 1


@pytest.mark.parametrize("shape", [(96, 48), (48, 96), (4, 64, 192)])
def test_newton_schulz_bf16_is_close_to_orthogonal(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out = newton_schulz(g)  # bf16, 5 steps
    assert out.dtype == torch.bfloat16 and out.shape == g.shape
    s = torch.linalg.svdvals(out.float())
    # the quintic's band is [0.68, 1.20] (muon.py); bf16 rounding widens it by ~0.02
    assert s.min() > 0.65 and s.max() < 1.22
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh  # the exact orthogonalization U V^T
    cos = (out.float() * polar).sum() / (out.float().norm() * polar.norm())
    assert cos > 0.97  # same singular vectors; only the singular values are approximate


def test_shape_scale_and_split_blocks():
    assert shape_scale(3072, 768) == 2.0 and shape_scale(768, 3072) == 1.0 and shape_scale(768, 768) == 1.0
    g = torch.randn(3 * 32, 32, generator=torch.Generator().manual_seed(2))  # a fused q/k/v gradient (96, 32)
    (split,), (whole,) = orthogonalize([g], 3, 5), orthogonalize([g], 1, 5)
    # split: q, k, v orthogonalized each on its own, scale sqrt(max(1, 32/32)) = 1
    assert torch.equal(split.view(3, 32, 32), newton_schulz(g.view(3, 32, 32)))
    # whole: one tall (96, 32) matrix, scale sqrt(96/32)
    assert torch.equal(whole, newton_schulz(g) * shape_scale(96, 32))
    assert (split.float() - whole.float()).norm() > 0.3 * whole.float().norm()


def test_muon_update_by_hand():
    """Two steps: buf1 = g1, u1 = g1 + m*buf1; buf2 = m*buf1 + g2, u2 = g2 + m*buf2; p -= lr*(NS(u)*scale) after
    decoupled decay p *= 1 - lr*wd."""
    gen = torch.Generator().manual_seed(3)
    w0, g1, g2 = (torch.randn(64, 32, generator=gen) for _ in range(3))
    p = torch.nn.Parameter(w0.clone())
    lr, m, wd = 0.1, 0.9, 0.5
    opt = Muon([p], lr=lr, momentum=m, weight_decay=wd)
    expected = w0.clone()
    buf = torch.zeros_like(w0)
    for g in (g1, g2):
        p.grad = g.clone()
        opt.step()
        buf = buf.mul(m).add(g)  # the optimizer's own op order, so the bf16 inputs match to the bit
        update = (newton_schulz(g.add(buf, alpha=m)) * shape_scale(64, 32)).float()
        expected = expected * (1 - lr * wd) - lr * update
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_muon_refuses_non_matrices():
    with pytest.raises(ValueError, match="2-D matrices .* give it to AdamW"):
        Muon([torch.nn.Parameter(torch.zeros(4))])


def test_split_params_puts_hidden_matrices_on_muon():
    cfg = load_pretrain_config(None, TINY)
    model = train_gpt.GPT(cfg.model)
    qkv, hidden, matrices, vectors = split_params(model)
    blocks = model.transformer.h
    assert [id(p) for p in qkv] == [id(b.attn.c_attn.weight) for b in blocks]
    assert {id(p) for p in hidden} == {id(getattr(b, m).c_proj.weight) for b in blocks for m in ("attn", "mlp")} | \
        {id(b.mlp.c_fc.weight) for b in blocks}
    t = model.transformer
    assert {id(p) for p in matrices} == {id(t.wte.weight), id(t.wpe.weight)}  # lm_head is wte (tied)
    assert all(p.dim() == 1 for p in vectors)
    everything = [id(p) for group in (qkv, hidden, matrices, vectors) for p in group]
    assert sorted(everything) == sorted(id(p) for p in model.parameters())  # a partition, nothing twice


def test_muon_tiny_run_loss_falls(data_dir, tmp_path):  # noqa: F811
    stream = make_cfg(data_dir, tmp_path / "stream", *MUON, "train.max_steps=60")
    train_gpt.train(stream)
    curve = losses(stream.run_dir)
    assert curve[1] == pytest.approx(math.log(VOCAB), abs=0.3)
    assert sum(curve[s] for s in range(56, 61)) / 5 < curve[1] - 0.4  # the chain's bigrams are being learned
    # one fixed batch: with the hidden matrices all but frozen (muon_lr 1e-6) only the embeddings learn and the
    # loss stalls ~0.5 (measured); with Muon moving them it must fall much further
    over = ["train.overfit_batch=true", "train.max_steps=80", 'schedule.kind="constant"', "optim.weight_decay=0.0"]
    fit = train_gpt.train(make_cfg(data_dir, tmp_path / "fit", *MUON, *over))
    frozen = train_gpt.train(make_cfg(data_dir, tmp_path / "frozen", *MUON, *over, "optim.muon_lr=1e-6"))
    assert fit["final_train_loss"] < 0.05 * curve[1]
    assert frozen["final_train_loss"] > 2 * fit["final_train_loss"]


def test_muon_resume_after_kill_equals_uninterrupted(data_dir, tmp_path):  # noqa: F811
    full, killed = kill_and_resume(data_dir, tmp_path, *MUON)  # model, Muon momentum and AdamW moments restored
    assert losses(killed.run_dir) == losses(full.run_dir)
    assert losses(killed.run_dir, "val", "val_loss") == losses(full.run_dir, "val", "val_loss")
    state = torch.load(killed.run_dir / "checkpoint.pt", weights_only=True)
    momentum = [k for k, v in state["optimizer"]["state"].items() if "momentum_buffer" in v]
    assert len(momentum) == 4 * 2 and all(".h." in k for k in momentum)  # 4 hidden matrices x 2 blocks


def test_lr_ratio_gives_muon_its_own_peak(data_dir, tmp_path):  # noqa: F811
    cfg = make_cfg(data_dir, tmp_path / "lr", *MUON, "optim.lr=1e-3", "optim.muon_lr=0.05")
    opt = train_gpt.make_optimizer(train_gpt.GPT(cfg.model), cfg, torch.device("cpu"))
    ratios = sorted(g["lr_ratio"] for g in opt.param_groups)
    assert ratios == [1.0, 1.0, pytest.approx(50.0), pytest.approx(50.0)]  # 2 AdamW groups, 2 Muon groups


@pytest.mark.parametrize("override, message", [
    ('train.optimizer="sgd"', "train.optimizer.*allowed values: 'adamw', 'muon'"),
    ("optim.muon_momentum=1.0", "optim.muon_momentum.*must be < 1"),
    ("optim.muon_ns_steps=0", "optim.muon_ns_steps.*must be >= 1"),
    ("optim.muon_lr=0", "optim.muon_lr.*must be > 0"),
])
def test_muon_config_errors_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_pretrain_config(None, [*TINY, override])
