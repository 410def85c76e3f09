"""FP8 matmuls for the trainer's nn.Linear layers (train.fp8): e4m3 operands forward, e5m2 gradients backward,
per-tensor dynamic scales. The class swap keeps parameter names, so checkpoints and export are unchanged."""
from __future__ import annotations

import torch
import torch.nn as nn


def _to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic scaling: map amax to the format's largest finite value; returns (t8, 1/scale)."""
    scale = torch.finfo(dtype).max / t.abs().amax().float().clamp(min=1e-12)
    return (t.float() * scale).to(dtype), scale.reciprocal()


class _FP8Matmul(torch.autograd.Function):
    """y = x @ w.T with e4m3 operands forward and e5m2 output gradients backward (Micikevicius et al. 2022,
    "FP8 Formats for Deep Learning"); master weights, optimizer and accumulation stay in higher precision."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, fast_accum: bool) -> torch.Tensor:  # x (M, K), w (N, K)
        (x8, sx), (w8, sw) = _to_fp8(x, torch.float8_e4m3fn), _to_fp8(w, torch.float8_e4m3fn)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.dtypes = (x.dtype, w.dtype)
        return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                use_fast_accum=fast_accum)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # g (M, N); _scaled_mm wants its 2nd operand column-major
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = _to_fp8(g, torch.float8_e5m2)
        gx = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=sg, scale_b=sw, out_dtype=torch.bfloat16)
        gw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=sg, scale_b=sx,
                              out_dtype=torch.float32)
        return gx.to(ctx.dtypes[0]), gw.to(ctx.dtypes[1]), None


class FP8Linear(nn.Linear):
    """nn.Linear with its matmul in FP8; same parameters and names, so checkpoints and export are unchanged.
    fast_accum: the forward GEMM accumulates with Hopper's fast FP8 path (use_fast_accum), which skips the
    periodic promotion of partial sums to full fp32; the two gradient GEMMs keep precise accumulation, the split
    torchao's float8 training uses by default."""
    fast_accum = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _FP8Matmul.apply(x.reshape(-1, x.size(-1)), self.weight, self.fast_accum).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def use_fp8(model: nn.Module, which: str, fast_accum: bool = False) -> None:
    """Swap the chosen Linears' class in place: 'lm_head' (the largest matmul, as modded-nanogpt), 'blocks'
    (every Linear but the head, which the chunked loss computes itself) or 'all'."""
    for name, module in model.named_modules():
        head = name == "lm_head"
        if type(module) is nn.Linear and (which == "all" or (which == "blocks") != head):
            module.__class__ = FP8Linear
            module.fast_accum = fast_accum
