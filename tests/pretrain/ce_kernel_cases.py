"""Cases for ce_kernel.py run by Triton's interpreter on CPU; test_triton_kernels.py runs this file in a pytest
subprocess with TRITON_INTERPRET=1, which must be set before triton is first imported (its library functions
are wrapped at import). Per-row loss and the in-place gradient equal the torch formulas, padded columns stay
out, and the chunked loss gives the same loss and gradients with the kernel as without."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/pretrain/test_triton_kernels.py"

from scalelab.pretrain import ce_kernel  # noqa: E402
from scalelab.pretrain.chunked_ce import chunked_cross_entropy  # noqa: E402
from tests.pretrain.test_chunked_ce import V, VP, inputs, plain_loss, rel  # noqa: E402


def rows_case(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(6, VP, generator=g)).to(dtype)
    logits[:, V:] = 50.0  # padded columns: large, so any leak into the softmax would show
    return logits, torch.randint(0, V, (6,), generator=g)


def test_rows_loss_and_gradient_fp32():
    logits, t = rows_case(torch.float32)
    ref_loss = F.cross_entropy(logits[:, :V], t, reduction="none")
    ref_grad = torch.zeros_like(logits)
    ref_grad[:, :V] = (logits[:, :V].softmax(-1) - F.one_hot(t, V).float()) / 10
    work = logits.clone()
    loss = ce_kernel.cross_entropy_rows_(work, t, V, 0.1, want_grad=True, block=64)  # 5 blocks, the last partial
    assert loss.dtype == torch.float32 and torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert torch.allclose(work, ref_grad, rtol=1e-5, atol=1e-7)
    assert torch.count_nonzero(work[:, V:]) == 0


def test_rows_without_gradient_leave_the_logits():
    logits, t = rows_case(torch.float32, 1)
    work = logits.clone()
    loss = ce_kernel.cross_entropy_rows_(work, t, V, 0.1, want_grad=False, block=128)
    assert torch.equal(work, logits)
    assert torch.allclose(loss, F.cross_entropy(logits[:, :V], t, reduction="none"), rtol=1e-5)


def test_rows_bf16_write_a_bf16_gradient():
    logits, t = rows_case(torch.bfloat16, 2)
    ref = (logits[:, :V].float().softmax(-1) - F.one_hot(t, V).float()) / 6
    work = logits.clone()
    loss = ce_kernel.cross_entropy_rows_(work, t, V, 1 / 6, want_grad=True)
    assert work.dtype == torch.bfloat16 and rel(work[:, :V].float(), ref) < 1e-2  # bf16 rounding of the result
    assert torch.allclose(loss, F.cross_entropy(logits[:, :V].float(), t, reduction="none"), rtol=1e-5)


@pytest.mark.parametrize("chunks", [1, 3])
def test_chunked_loss_with_the_kernel_equals_plain(chunks):
    h, w, t = inputs(7)
    ref = plain_loss(h, w, t)
    gh, gw = torch.autograd.grad(ref, (h, w))
    out = chunked_cross_entropy(h, w, t, chunks, V, kernel="triton")
    ch, cw = torch.autograd.grad(out, (h, w))
    assert out.item() == pytest.approx(ref.item(), rel=1e-5)
    assert rel(ch, gh) < 1e-5 and rel(cw, gw) < 1e-5 and torch.count_nonzero(cw[V:]) == 0



def test_rows_e5m2_gradient_in_both_layouts():
    logits, t = rows_case(torch.bfloat16, 3)
    logits = torch.cat([logits] * 7)[:37]  # 37 rows: the last row tile is partial
    t = torch.cat([t] * 7)[:37]
    work = logits.clone()
    loss, g8, g8t = ce_kernel.cross_entropy_rows_e5m2(work, t, V, block=64, tile=(16, 64))  # partial tiles too
    ref = torch.zeros(37, VP)
    ref[:, :V] = (logits[:, :V].float().softmax(-1) - F.one_hot(t, V).float()) * ce_kernel.E5M2_MAX
    codes = lambda x: x.view(torch.uint8).int()  # noqa: E731
    diff = (codes(g8) - codes(ref.to(torch.float8_e5m2))).abs()
    normal = ref.abs() >= torch.finfo(torch.float8_e5m2).smallest_normal
    assert g8.dtype == torch.float8_e5m2 and diff[normal].max() == 0 and diff.max() <= 1  # fp8_kernels.fp8_codes
    assert torch.equal(codes(g8t), codes(g8).t()) and torch.count_nonzero(codes(g8)[:, V:]) == 0
    _, hw8, _ = ce_kernel.cross_entropy_rows_e5m2(work, t, V, block=64, tile=(16, 64), hw_cast=True)
    assert torch.equal(codes(hw8), codes(g8))  # the interpreter truncates its casts: it rounds in integers either way
    assert torch.equal(work, logits)  # read, not overwritten
    assert torch.allclose(loss, F.cross_entropy(logits[:, :V].float(), t, reduction="none"), rtol=1e-5)
    assert ce_kernel.E5M2_MAX == torch.finfo(torch.float8_e5m2).max


@pytest.mark.parametrize("chunks", [1, 3])
def test_fp8_chunked_loss_with_the_e5m2_kernel_equals_the_fp8_torch_path(chunks):
    h, w, t = inputs(8)
    ref = chunked_cross_entropy(h, w, t, chunks, V, fp8=True)          # torch ops, then quantize at the same scale
    gh, gw = torch.autograd.grad(ref, (h, w))
    out = chunked_cross_entropy(h, w, t, chunks, V, fp8=True, kernel="triton-e5m2")
    ch, cw = torch.autograd.grad(out, (h, w))
    assert out.item() == pytest.approx(ref.item(), rel=1e-6)
    fp8_error = rel(ch, torch.autograd.grad(plain_loss(h, w, t), h)[0])  # both are FP8 gradients: ~3% from fp32
    # the kernel rounds through fp16 (two roundings), so a few elements land one e5m2 code (25%) apart: ~0.1%
    assert rel(ch, gh) < 5e-3 and rel(cw, gw) < 5e-3 and torch.count_nonzero(cw[V:]) == 0
    assert rel(ch, gh) < fp8_error / 10 and fp8_error < 0.1
