"""Triton kernels for the per-row FP8 MLP (train.fp8_gelu_kernel): GELU and its gradient, each fused with the
per-row FP8 cast of its output, one pass over each row.

Compiled, the GELU + row amax + cast is a reduction that Inductor runs as two passes over 3,072-wide rows (a
profile of the per-row FP8 recipe, bench/gpu_pretrain_profile.py, shows both sides among the largest elementwise
kernels); here a program holds its row in registers, so h is read once and a, a8 and the row's scale are written
once.

On the GPU, FP8 and bf16 values come from the hardware's casts (cvt.rn.satfinite: round to nearest-even, as
torch's casts for values in range); Triton's CPU interpreter truncates instead, so there (HW=False) the kernels
round to nearest-even in integer arithmetic, and the CPU tests check those bytes against torch's casts. On sm_90
the hardware's casts make both kernels shorter in SASS than the integer rounding (bench/triton_kernel_sass.py
compiles them without a GPU and counts).
"""
from __future__ import annotations

import math

import torch

from scalelab.pretrain.triton_support import INTERPRETED, require_triton, tl, triton

E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # torch.finfo(torch.float8_e4m3fn / float8_e5m2).max
GELU_K = math.sqrt(2.0 / math.pi)  # GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016)
# Warps per 3,072-wide row: the fastest of 4/8/16/32 with each kernel timed alone (bench/gpu_row_kernels.py);
# the gradient holds two inputs per thread, so it wants fewer warps than GELU.
GELU_WARPS, GELU_GRAD_WARPS = 16, 4


def fp8_codes(x, E5M2: tl.constexpr, HW: tl.constexpr):
    """x (fp32, |x| <= the format's max) -> e5m2 or e4m3fn codes as uint8, rounded to nearest-even: by the
    hardware's cast (HW), else by _fp8_codes_int."""
    if HW:
        if E5M2:
            out = x.to(tl.float8e5).to(tl.uint8, bitcast=True)
        else:
            out = x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        out = _fp8_codes_int(x, E5M2)
    return out


def _fp8_codes_int(x, E5M2: tl.constexpr):
    """fp8_codes in integer arithmetic, for the interpreter. Normal numbers: re-bias fp32's exponent and drop 21
    (e5m2) or 20 (e4m3) mantissa bits, a carry moving into the exponent. Below the smallest normal: through fp16,
    of which e5m2 is the high byte and e4m3 (after 2^-8) the high byte but one; rounding twice there can miss by
    one code, only for those tiny values."""
    v = tl.abs(x)
    b = v.to(tl.int32, bitcast=True)
    if E5M2:
        c = b - (112 << 23)
        normal = (c + 0xFFFFF + ((c >> 21) & 1)) >> 21
        h = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
        code = tl.where(v < 6.103515625e-05, (h + 0x7F + ((h >> 8) & 1)) >> 8, normal)  # 2^-14
    else:
        c = b - (120 << 23)
        normal = (c + 0x7FFFF + ((c >> 20) & 1)) >> 20
        h = (v * 0.00390625).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
        code = tl.where(v < 0.015625, (h + 0x3F + ((h >> 7) & 1)) >> 7, normal)  # 2^-6
        code = tl.minimum(code, 0x7E)  # 0x7E = 448; 0x7F is e4m3fn's NaN
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    return (sign | code).to(tl.uint8)


def _bf16(x, HW: tl.constexpr):
    """x fp32 -> bf16, round to nearest-even: the hardware's cast (HW), else in integers (bf16 is fp32's high
    half), since Triton's CPU interpreter truncates."""
    if HW:
        out = x.to(tl.bfloat16)
    else:
        bits = x.to(tl.int32, bitcast=True)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return out


def _sigmoid2(h, K: tl.constexpr):
    """s = sigmoid(2z), z = K(h + 0.044715 h^3): 1 + tanh(z) = 2s and 1 - tanh(z)^2 = 4s(1 - s), so neither GELU
    nor its gradient subtracts nearly equal numbers where tanh(z) is close to -1 (h very negative)."""
    return tl.sigmoid(2.0 * K * (h + 0.044715 * h * h * h))


def _row_cast(y, out_ptr, out8_ptr, inv_ptr, row, offs, mask, FP8_MAX: tl.constexpr, E5M2: tl.constexpr,
              HW: tl.constexpr):
    """Store y as bf16, and its e4m3/e5m2 codes with the row's 1/scale; the scale comes from the bf16 values,
    as fp8.quantize_rows computes it from a bf16 tensor."""
    yb = _bf16(y, HW)
    tl.store(out_ptr + offs, yb, mask=mask)
    yf = yb.to(tl.float32)
    scale = FP8_MAX / tl.maximum(tl.max(tl.abs(yf), 0), 1e-12)
    tl.store(out8_ptr + offs, fp8_codes(yf * scale, E5M2, HW), mask=mask)
    tl.store(inv_ptr + row, 1.0 / scale)


def _gelu_rows(h_ptr, a_ptr, a8_ptr, inv_ptr, N: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr,
               HW: tl.constexpr):
    """a = gelu_tanh(h) per row, with its e4m3 row cast (the next GEMM's input)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    h = tl.load(h_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    a = h * _sigmoid2(h, K)  # 0.5 h (1 + tanh(z))
    _row_cast(a, a_ptr, a8_ptr, inv_ptr, row, row * N + cols, mask, 448.0, False, HW)  # E4M3_MAX


def _gelu_grad_rows(da_ptr, h_ptr, gh_ptr, gh8_ptr, inv_ptr, N: tl.constexpr, BLOCK: tl.constexpr,
                    K: tl.constexpr, HW: tl.constexpr):
    """gh = da * gelu_tanh'(h) per row, with its e5m2 row cast (the input-gradient GEMM's input)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    h = tl.load(h_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    da = tl.load(da_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    s = _sigmoid2(h, K)
    d = s + 2.0 * h * s * (1.0 - s) * K * (1.0 + 3.0 * 0.044715 * h * h)  # d/dh of 0.5 h (1 + tanh(z))
    _row_cast(da * d, gh_ptr, gh8_ptr, inv_ptr, row, row * N + cols, mask, 57344.0, True, HW)  # E5M2_MAX


if triton is not None:  # module-level kernels torch.compile can place in its graph; helpers inline into them
    _fp8_codes_int, _bf16, _sigmoid2 = triton.jit(_fp8_codes_int), triton.jit(_bf16), triton.jit(_sigmoid2)
    fp8_codes = triton.jit(fp8_codes)
    _row_cast = triton.jit(_row_cast)
    _GELU_ROWS, _GELU_GRAD_ROWS = triton.jit(_gelu_rows), triton.jit(_gelu_grad_rows)


def _launch(kernel, inputs: list[torch.Tensor], e5m2: bool,
            num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = inputs[0]
    require_triton(x, "train.fp8_gelu_kernel", "train.fp8_gelu_kernel=false")
    if any(t.dim() != 2 or not t.is_contiguous() for t in inputs):
        raise ValueError("the FP8 GELU kernels take contiguous (rows, features) tensors")
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=torch.bfloat16, device=x.device)
    out8 = torch.empty(rows, n, dtype=torch.uint8, device=x.device)
    inv = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)  # a whole row per program
    kernel[(rows,)](*inputs, out, out8, inv, N=n, BLOCK=block, K=GELU_K, HW=not INTERPRETED, num_warps=num_warps)
    return out, out8.view(torch.float8_e5m2 if e5m2 else torch.float8_e4m3fn), inv


def gelu_rows(h: torch.Tensor,
              num_warps: int = GELU_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a bf16, a8 e4m3, 1/scale (rows, 1)) for a = gelu_tanh(h), h (rows, features); bench/gpu_row_kernels.py
    times other num_warps."""
    return _launch(_GELU_ROWS, [h], False, num_warps)


def gelu_grad_rows(da: torch.Tensor, h: torch.Tensor,
                   num_warps: int = GELU_GRAD_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gh bf16, gh8 e5m2, 1/scale (rows, 1)) for gh = da * gelu_tanh'(h)."""
    return _launch(_GELU_GRAD_ROWS, [da, h], True, num_warps)
