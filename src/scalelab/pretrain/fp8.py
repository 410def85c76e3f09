"""FP8 matmuls for the trainer's nn.Linear layers (train.fp8): e4m3 operands forward, e5m2 gradients backward.
Two scalings (train.fp8_scaling): one dynamic scale per tensor, all three GEMMs in FP8; or one scale per row, with
the weight-gradient GEMM in bf16. The class swap keeps parameter names, so checkpoints and export are unchanged.
quantize / mm8 are also what the chunked LM head (chunked_ce.py) uses for its FP8 head."""
from __future__ import annotations

import torch
import torch.nn as nn

from scalelab.pretrain.fp8_kernels import gelu_grad_rows, gelu_rows

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2  # forward operands; gradients (wider range, 2 mantissa bits)


def quantize(t: torch.Tensor, dtype: torch.dtype, amax: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaling: map amax to the format's largest finite value; returns (t8, 1/scale). amax None:
    measured (dynamic scaling, one more read of t); a float: a bound the caller knows |t| keeps (static)."""
    if amax is None:
        scale = torch.finfo(dtype).max / t.abs().amax().float().clamp(min=1e-12)
    else:
        scale = torch.full((), torch.finfo(dtype).max / amax, dtype=torch.float32, device=t.device)
    return (t.float() * scale).to(dtype), scale.reciprocal()


def quantize_rows(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of a 2-D t: returns (t8, 1/scale) with the scales shaped (rows, 1). A row's amax is a
    reduction along the row, so torch.compile fuses it into the kernel that produces the row (LayerNorm, GELU, a
    gradient's elementwise tail): no extra pass over t, unlike one amax over the whole tensor before the cast."""
    scale = torch.finfo(dtype).max / t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    return (t.float() * scale).to(dtype), scale.reciprocal()


def mm8(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype,
        fast_accum: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias, in the GEMM's epilogue) of two quantized operands, (M, K) @ (K, N), dequantized into
    out_dtype. _scaled_mm wants `a` row-major and `b` column-major; either is copied into that layout only when
    it is not already in it."""
    a8 = a8 if a8.is_contiguous() else a8.contiguous()
    b8 = b8 if b8.t().is_contiguous() else b8.t().contiguous().t()
    return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype,
                            use_fast_accum=fast_accum)


class _FP8Matmul(torch.autograd.Function):
    """y = x @ w.T with e4m3 operands forward and e5m2 output gradients backward (Micikevicius et al. 2022,
    "FP8 Formats for Deep Learning"); master weights, optimizer and accumulation stay in higher precision."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, fast_accum: bool) -> torch.Tensor:  # x (M, K), w (N, K)
        (x8, sx), (w8, sw) = quantize(x, E4M3), quantize(w, E4M3)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.dtypes = (x.dtype, w.dtype)
        return mm8(x8, sx, w8.t(), sw, torch.bfloat16, fast_accum)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # g (M, N)
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = quantize(g, E5M2)
        gx = mm8(g8, sg, w8, sw, torch.bfloat16)
        gw = mm8(g8.t(), sg, x8, sx, torch.float32)
        return gx.to(ctx.dtypes[0]), gw.to(ctx.dtypes[1]), None


class _FP8RowMatmul(torch.autograd.Function):
    """y = x @ w.T + b with row-wise scales (torchao's "rowwise with high-precision weight gradient" recipe): x per
    token, w per output feature forward; g per token and w per input feature for the input gradient. The weight
    gradient g.T @ x contracts over tokens, where per-token scales cannot be factored out of the sum, so it stays a
    bf16 GEMM; that also spares the two transposed FP8 copies a per-tensor weight gradient needs (cuBLAS's FP8
    GEMM takes only row-major A and column-major B). Two of the three GEMMs run in FP8.
    The bias is added in the FP8 GEMM's epilogue, and its gradient (a sum of g over tokens) is a GEMM too: left to
    torch.compile, that column sum fuses with g's row amax into one kernel that reads g across rows, several
    times slower than either reduction alone (bench/gpu_pretrain_profile.py shows it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, fast_accum: bool) -> torch.Tensor:
        (x8, sx), (w8, sw) = quantize_rows(x, E4M3), quantize_rows(w, E4M3)  # x (M, K), w (N, K), b (N,)
        ctx.save_for_backward(x.to(torch.bfloat16), w)  # y and so g are bf16: the weight gradient's precision
        ctx.x_dtype, ctx.b_dtype = x.dtype, None if b is None else b.dtype
        return mm8(x8, sx, w8.t(), sw.t(), torch.bfloat16, fast_accum, _bf16(b))

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # g (M, N)
        x, w = ctx.saved_tensors
        g = g.to(torch.bfloat16)
        gx, gw, gb = _row_grads(g, *quantize_rows(g, E5M2), x, w, ctx.b_dtype)
        return gx.to(ctx.x_dtype), gw.to(w.dtype), gb, None


def _row_grads(g: torch.Tensor, g8: torch.Tensor, sg: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
               b_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The per-row recipe's backward of y = x @ w.T + b from g (bf16) and its row cast (g8, 1/scale): the input
    gradient in FP8 with w scaled per input feature, the weight gradient g.T @ x in bf16, the bias gradient a
    ones-row GEMM."""
    wt8, swt = quantize_rows(w.t(), E4M3)  # wt8 (K, N)
    gx = mm8(g8, sg, wt8.t(), swt.t(), torch.bfloat16)
    gb = None if b_dtype is None else (g.new_ones(1, g.size(0)) @ g).view(-1).to(b_dtype)
    return gx, g.t() @ x, gb


def _bf16(b: torch.Tensor | None) -> torch.Tensor | None:
    return None if b is None else b.to(torch.bfloat16)


class _FP8RowMLP(torch.autograd.Function):
    """proj(gelu_tanh(fc(x))) in the per-row recipe of _FP8RowMatmul, with GELU and its gradient each fused with
    their row cast to FP8 (fp8_kernels.py): the hidden activation, 4x wider than x, is read once per direction
    instead of twice by a compiled reduction and again by the cast."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, fast_accum: bool) -> torch.Tensor:  # x (M, C), w1 (4C, C), w2 (C, 4C)
        (x8, sx), (w18, sw1), (w28, sw2) = quantize_rows(x, E4M3), quantize_rows(w1, E4M3), quantize_rows(w2, E4M3)
        h = mm8(x8, sx, w18.t(), sw1.t(), torch.bfloat16, fast_accum, _bf16(b1))
        a, a8, sa = gelu_rows(h)
        ctx.save_for_backward(x.to(torch.bfloat16), h, a, w1, w2)
        ctx.dtypes = (x.dtype, None if b1 is None else b1.dtype, None if b2 is None else b2.dtype)
        return mm8(a8, sa, w28.t(), sw2.t(), torch.bfloat16, fast_accum, _bf16(b2))

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, h, a, w1, w2 = ctx.saved_tensors
        gy = gy.to(torch.bfloat16)
        da, gw2, gb2 = _row_grads(gy, *quantize_rows(gy, E5M2), a, w2, ctx.dtypes[2])
        gh, gh8, sgh = gelu_grad_rows(da, h)
        gx, gw1, gb1 = _row_grads(gh, gh8, sgh, x, w1, ctx.dtypes[1])
        return gx.to(ctx.dtypes[0]), gw1.to(w1.dtype), gb1, gw2.to(w2.dtype), gb2, None


def row_mlp(x: torch.Tensor, fc: nn.Linear, proj: nn.Linear) -> torch.Tensor:
    """GPT-2's MLP, proj(gelu_tanh(fc(x))), as _FP8RowMLP (train.fp8_gelu_kernel); fc's fast_accum applies."""
    y = _FP8RowMLP.apply(x.reshape(-1, x.size(-1)), fc.weight, fc.bias, proj.weight, proj.bias, fc.fast_accum)
    return y.view(*x.shape[:-1], -1)


class FP8Linear(nn.Linear):
    """nn.Linear with its matmul in FP8; same parameters and names, so checkpoints and export are unchanged.
    fast_accum: the forward GEMM accumulates with Hopper's fast FP8 path (use_fast_accum), which skips the
    periodic promotion of partial sums to full fp32; the two gradient GEMMs keep precise accumulation, the split
    torchao's float8 training uses by default. rowwise: _FP8RowMatmul's scaling instead of per-tensor scales."""
    fast_accum = False
    rowwise = False
    gelu_kernel = False  # an MLP's c_fc with this set runs row_mlp (train.fp8_gelu_kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.size(-1))
        if self.rowwise:
            return _FP8RowMatmul.apply(x2, self.weight, self.bias, self.fast_accum).view(*x.shape[:-1], -1)
        y = _FP8Matmul.apply(x2, self.weight, self.fast_accum).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def require_fp8(device: torch.device) -> None:
    """FP8 tensor cores arrived with compute capability 8.9 (Ada: L4, L40S) and 9.0 (Hopper); on older GPUs
    torch._scaled_mm fails deep inside the first compiled step, so refuse before building anything."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"config field 'train.fp8': {torch.cuda.get_device_name(device)} is sm_{major}{minor}, "
                         "FP8 matmuls need compute capability 8.9+ (L4, L40S, H100, H200); set train.fp8='none'")


def use_fp8(model: nn.Module, which: str, fast_accum: bool = False, rowwise: bool = False,
            gelu_kernel: bool = False) -> None:
    """Swap the chosen Linears' class in place: 'lm_head' (the largest matmul, as modded-nanogpt), 'blocks'
    (every Linear but the head) or 'all'. Under train.loss_chunks the chunked loss computes the head and reads
    the swap: an FP8Linear head makes its three matmuls FP8 too, with per-tensor scales whatever `rowwise` says
    (its logit gradient has a static scale, chunked_ce.py)."""
    for name, module in model.named_modules():
        head = name == "lm_head"
        if type(module) is nn.Linear and (which == "all" or (which == "blocks") != head):
            module.__class__ = FP8Linear
            module.fast_accum, module.rowwise, module.gelu_kernel = fast_accum, rowwise, rowwise and gelu_kernel
