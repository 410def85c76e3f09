"""Cases for fp8_kernels.py run by Triton's interpreter on CPU; test_triton_kernels.py runs this file in a pytest
subprocess with TRITON_INTERPRET=1 (set before triton is first imported). FP8 codes equal torch's casts, GELU
and its gradient match float64 within bf16 rounding, and the fused MLP matches the per-row FP8 Linears."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/pretrain/test_triton_kernels.py"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from scalelab.pretrain import fp8_kernels  # noqa: E402
from scalelab.pretrain.fp8 import E4M3, E5M2, quantize_rows, use_fp8  # noqa: E402


@triton.jit
def _codes_kernel(x_ptr, out_ptr, n, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, fp8_kernels.fp8_codes(x, E5M2, False), mask=offs < n)  # the interpreter's path


def codes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).int()


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_fp8_codes_round_like_torch(dtype):
    g = torch.Generator().manual_seed(0)
    top = torch.finfo(dtype).max
    x = torch.cat([torch.randn(3000, generator=g) * top / 8, torch.tensor([top, -top, 0.0, -0.0]),
                   (torch.rand(500, generator=g) - 0.5) * 2 ** -5,                 # around the subnormal range
                   torch.tensor([1.0625, 1.1875, -1.0625, 0.5625]) if dtype == E4M3 else torch.tensor([1.125, -1.375])])
    x = x.clamp(-top, top).float()                                                 # ties of the last rows: to even
    out = torch.empty(x.numel(), dtype=torch.uint8)
    _codes_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), E5M2=dtype == E5M2, BLOCK=256)
    ref, tiny = codes(x.to(dtype)), x.abs() < torch.finfo(dtype).smallest_normal
    diff = (out.int() - ref).abs()
    assert torch.equal(out.int()[~tiny], ref[~tiny])       # normal numbers: exactly torch's round-to-nearest-even
    assert diff.max() <= 1                                  # subnormals: through fp16, at most one code apart


def gelu64(h: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU in float64, as h * sigmoid(2z) (= 0.5 h (1 + tanh z)), whose tail does not cancel to 0."""
    h = h.double()
    ref = h * torch.sigmoid(2 * (2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3))
    assert torch.allclose(ref, F.gelu(h, approximate="tanh"), rtol=1e-12, atol=1e-15)
    return ref


def test_gelu_rows_match_float64_and_cast_like_quantize_rows():
    g = torch.Generator().manual_seed(1)
    h = (2 * torch.randn(9, 300, generator=g)).to(torch.bfloat16)
    h[3] *= 1e-3                                               # a row of tiny values: its own scale
    a, a8, inv = fp8_kernels.gelu_rows(h)
    ref = gelu64(h)
    assert a.dtype == torch.bfloat16 and ((a.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-30).all()
    r8, rinv = quantize_rows(a, E4M3)                          # torch's cast of the kernel's own bf16 output
    diff = (codes(a8) - codes(r8)).abs()
    assert a8.dtype == E4M3 and diff.max() <= 1 and (diff > 0).float().mean() < 0.01
    assert inv.shape == (9, 1) and torch.allclose(inv, rinv, rtol=1e-6)
    assert inv[3].item() < inv[0].item() / 100                 # the tiny row kept its own, finer scale


def test_gelu_grad_rows_match_float64():
    g = torch.Generator().manual_seed(2)
    h = (2 * torch.randn(7, 200, generator=g)).to(torch.bfloat16)
    da = torch.randn(7, 200, generator=g).to(torch.bfloat16)
    hd = h.double().requires_grad_()
    (ref,) = torch.autograd.grad(gelu64(hd), hd, da.double())
    gh, gh8, inv = fp8_kernels.gelu_grad_rows(da, h)
    assert gh.dtype == torch.bfloat16 and ((gh.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-30).all()
    r8, rinv = quantize_rows(gh, E5M2)
    diff = (codes(gh8) - codes(r8)).abs()
    assert gh8.dtype == E5M2 and diff.max() <= 1 and (diff > 0).float().mean() < 0.01
    assert torch.allclose(inv, rinv, rtol=1e-6)


def test_fused_mlp_matches_the_per_row_fp8_linears():
    from scalelab.pretrain import train_gpt
    from scalelab.pretrain.config import ModelConfig
    torch.manual_seed(3)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=64)
    ref, fused, full = (train_gpt.MLP(cfg) for _ in range(3))
    fused.load_state_dict(ref.state_dict()), full.load_state_dict(ref.state_dict())
    use_fp8(ref, "all", rowwise=True)
    use_fp8(fused, "all", rowwise=True, gelu_kernel=True)
    x = torch.randn(2, 8, 32)
    outs, grads = [], []
    for mlp in (ref, fused, full):
        xi = x.clone().requires_grad_()
        y = mlp(xi)
        y.float().backward(torch.ones_like(y, dtype=torch.float32) + xi.detach()[..., :1])
        outs.append(y.float())
        grads.append([xi.grad] + [p.grad for p in mlp.parameters()])
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(outs[1], outs[0]) < 1e-2 and rel(outs[1], outs[2]) < 0.1  # same recipe; FP8 against fp32
    for g_fused, g_ref, g_full in zip(grads[1], grads[0], grads[2]):
        assert rel(g_fused, g_ref) < 2e-2 and rel(g_fused, g_full) < 0.15
