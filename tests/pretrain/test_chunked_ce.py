"""train.loss_chunks (chunked_ce.py): the chunked LM head + cross-entropy gives the plain path's loss and
gradients (fp32: rel 1e-5), with padded vocab rows, uneven chunks, under no_grad, in a model and in training."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalelab.core.config import ConfigError
from scalelab.pretrain import train_gpt
from scalelab.pretrain.chunked_ce import chunked_cross_entropy
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.fp8 import _FP8Matmul
from tests.pretrain.test_train_gpt import TINY, data_dir, losses, make_cfg  # noqa: F401

V, VP, C = 256, 264, 32  # vocab, padded rows (never targeted, outside the softmax), width


def plain_loss(h, w, t):
    """The trainer's unchunked head: F.linear, drop padded columns, fp32 cross-entropy."""
    return F.cross_entropy(F.linear(h, w)[..., :V].float().reshape(-1, V), t.reshape(-1))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(4, 16, C, generator=g, requires_grad=True)
    w = (0.3 * torch.randn(VP, C, generator=g)).requires_grad_()
    return h, w, torch.randint(0, V, (4, 16), generator=g)


@pytest.mark.parametrize("chunks", [1, 5, 64])  # one chunk, uneven chunks (13,13,13,13,12), one row per chunk
def test_chunked_equals_plain_loss_and_grads(chunks):
    h, w, t = inputs()
    ref = plain_loss(h, w, t)
    gh, gw = torch.autograd.grad(ref, (h, w))
    out = chunked_cross_entropy(h, w, t, chunks, V)
    ch, cw = torch.autograd.grad(out, (h, w))
    assert out.item() == pytest.approx(ref.item(), rel=1e-5)
    assert rel(ch, gh) < 1e-5 and rel(cw, gw) < 1e-5
    assert torch.count_nonzero(cw[V:]) == 0  # padded rows get no gradient, as with the slice


def test_chunked_scales_by_the_incoming_gradient():
    h, w, t = inputs(1)
    (g_ref,) = torch.autograd.grad(3.0 * plain_loss(h, w, t), (w,))  # e.g. loss / accum, or a loss weight
    (g_out,) = torch.autograd.grad(3.0 * chunked_cross_entropy(h, w, t, 4, V), (w,))
    assert rel(g_out, g_ref) < 1e-5


def test_chunked_refuses_an_unknown_kernel():
    h, w, t = inputs(1)
    with pytest.raises(ValueError, match="kernel='cuda'.*'triton-e5m2'"):
        chunked_cross_entropy(h, w, t, 4, V, kernel="cuda")


def test_chunked_under_no_grad_is_the_same_loss():
    h, w, t = inputs(2)
    with torch.no_grad():
        out = chunked_cross_entropy(h, w, t, 3, V)
    assert not out.requires_grad and out.item() == pytest.approx(plain_loss(h, w, t).item(), rel=1e-6)


def test_chunked_follows_autocast_dtype():
    h, w, t = inputs(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # both paths: bf16 matmuls, fp32 softmax
        ref, out = plain_loss(h, w, t), chunked_cross_entropy(h, w, t, 4, V)
    gw_ref, = torch.autograd.grad(ref, (w,))
    gw_out, = torch.autograd.grad(out, (w,))
    assert out.item() == pytest.approx(ref.item(), rel=1e-6)  # same bf16 logits, same fp32 reduction
    assert rel(gw_out, gw_ref) < 1e-2  # bf16 grad: rounded per chunk here, once over all rows in the plain path
    assert out.item() != pytest.approx(plain_loss(h, w, t).item(), rel=1e-5)  # bf16 did change the logits


def model_grads(model: train_gpt.GPT, x, y) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = model(x, y)[1]
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_model_with_loss_chunks_equals_plain_model():
    cfg = load_pretrain_config(None, [*TINY, f"model.padded_vocab_size={VP}"]).model
    torch.manual_seed(0)
    model = train_gpt.GPT(cfg)
    g = torch.Generator().manual_seed(4)
    x, y = (torch.randint(0, V, (4, 16), generator=g) for _ in range(2))
    loss_a, grads_a = model_grads(model, x, y)
    model.loss_chunks = 3
    assert model(x, y)[0] is None  # loss only: no logits tensor
    loss_b, grads_b = model_grads(model, x, y)
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for name, grad in grads_a.items():  # every parameter, the tied wte / lm_head included
        assert rel(grads_b[name], grad) < 1e-5, name


def test_training_with_loss_chunks_matches_plain(data_dir, tmp_path):  # noqa: F811
    plain = make_cfg(data_dir, tmp_path / "plain", "train.max_steps=5")
    chunked = make_cfg(data_dir, tmp_path / "chunked", "train.max_steps=5", "train.loss_chunks=6")
    train_gpt.train(plain)
    train_gpt.train(chunked)
    a, b = losses(plain.run_dir), losses(chunked.run_dir)
    assert a.keys() == b.keys() and len(a) == 5
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5)


@pytest.mark.slow
def test_compiled_chunked_equals_eager():
    cfg = load_pretrain_config(None, [*TINY, f"model.padded_vocab_size={VP}"]).model
    torch.manual_seed(0)
    model = train_gpt.GPT(cfg, loss_chunks=4)
    g = torch.Generator().manual_seed(5)
    x, y = (torch.randint(0, V, (4, 16), generator=g) for _ in range(2))
    loss_eager, grads_eager = model_grads(model, x, y)
    model.zero_grad()
    loss = torch.compile(model)(x, y)[1]  # the autograd.Function traced by dynamo
    loss.backward()
    assert loss.item() == pytest.approx(loss_eager, rel=1e-5)
    for name, p in model.named_parameters():
        assert rel(p.grad, grads_eager[name]) < 1e-5, name


def test_static_quantize_uses_the_given_bound():
    from scalelab.pretrain.fp8 import E5M2, quantize
    g = torch.tensor([[0.5, -0.25, 1e-3], [0.0, -0.5, 0.125]]) / 8  # |g| <= 1/16
    g8, inv = quantize(g, E5M2, amax=1 / 16)
    assert inv.item() == pytest.approx((1 / 16) / 57344.0)  # 1/16 maps to e5m2's largest finite value
    assert torch.allclose(g8.float() * inv, g, rtol=0.13, atol=0)  # e5m2: 2 mantissa bits
    d8, dinv = quantize(g, E5M2)                                   # dynamic: the measured amax (0.5/8)
    assert dinv.item() == pytest.approx((0.5 / 8) / 57344.0)


@pytest.mark.parametrize("overrides, message", [
    (['train.loss_kernel="triton"'], "train.loss_kernel.*set train.loss_chunks > 0"),
    (['train.loss_kernel="triton-e5m2"', "train.loss_chunks=4", 'train.fp8="blocks"'],
     "writes the gradient of an FP8 head; train.fp8='blocks' keeps the head in bf16"),
    (['train.loss_chunks=65'], "train.loss_chunks.*micro_batch_size\\*block_size = 64"),  # B=4 x T=16
    (['train.loss_chunks=-1'], "train.loss_chunks.*must be >= 0"),
])
def test_loss_chunks_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_pretrain_config(None, [*TINY, *overrides])


def fp8_head_loss(h, w, t):
    """An FP8Linear head (fp8.py) with the plain loss after it: what an FP8 chunked head must equal."""
    logits = _FP8Matmul.apply(h.reshape(-1, C), w, False)  # FP8Linear.forward's matmul, on a plain tensor w
    return F.cross_entropy(logits[:, :V].float(), t.reshape(-1))


def test_fp8_chunked_head_is_the_fp8_linear_head(monkeypatch):
    h, w, t = inputs(3)
    ref = fp8_head_loss(h, w, t)
    rh, rw = torch.autograd.grad(ref, (h, w))
    fh, fw = torch.autograd.grad(plain_loss(h, w, t), (h, w))
    calls, real = [], torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(k["use_fast_accum"]) or real(*a, **k))
    out = chunked_cross_entropy(h, w, t, 1, V, fp8=True, fast_accum=True)
    ch, cw = torch.autograd.grad(out, (h, w))
    assert calls == [True, False, False]  # logits (fast accumulation), d/dh, d/dW: all three in FP8
    # one chunk: the same quantized operands and GEMM as the FP8Linear head, so the same loss; the gradients
    # differ only where the FP8Linear path rounds d(loss)/d(logits) to bf16 before e5m2
    assert out.item() == pytest.approx(ref.item(), rel=1e-6)
    assert rel(ch, rh) < 0.02 and rel(cw, rw) < 0.02
    assert 1e-4 < abs(out.item() - plain_loss(h, w, t).item()) < 0.02 * out.item()  # FP8 error: present, small
    assert rel(ch, fh) < 0.15 and rel(cw, fw) < 0.15
    assert torch.count_nonzero(cw[V:]) == 0


def test_fp8_chunks_quantize_each_chunk_apart():
    h, w, t = inputs(4)
    one, four = (chunked_cross_entropy(h, w, t, n, V, fp8=True).item() for n in (1, 4))
    assert one != four and four == pytest.approx(one, rel=0.02)  # per-chunk scales: close, not bit-equal


def test_model_fp8_head_reaches_the_chunked_loss():
    from scalelab.pretrain.fp8 import use_fp8
    cfg = load_pretrain_config(None, [*TINY, f"model.padded_vocab_size={VP}", 'train.fp8="all"',
                                      "train.loss_chunks=1"])
    torch.manual_seed(0)
    chunked, plain = train_gpt.GPT(cfg.model, loss_chunks=1), train_gpt.GPT(cfg.model)
    plain.load_state_dict(chunked.state_dict())
    for m in (chunked, plain):
        use_fp8(m, cfg.train.fp8)
    g = torch.Generator().manual_seed(6)
    x, y = (torch.randint(0, V, (4, 16), generator=g) for _ in range(2))
    # one chunk: the FP8 chunked head is the FP8Linear head, so the model's loss is the plain FP8 model's
    assert chunked(x, y)[1].item() == pytest.approx(plain(x, y)[1].item(), rel=1e-6)
