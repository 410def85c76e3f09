"""One Triton kernel for a chunk of the chunked loss (train.loss_kernel = "triton"): per row, the log-sum-exp
over the real vocabulary, the row's loss, and the gradient (softmax - one_hot) / N written over the logits.

Each row is read twice (online max/sum-exp, Milakov & Gimelshein 2018; then the gradient) and written once, in
place, as Liger-Kernel's cross-entropy does (Hsu et al. 2024), so no fp32 copy of the chunk and no separate
gradient buffer exist. Padded vocab columns get exactly zero gradient and are outside the softmax.
It runs near HBM bandwidth, about the speed torch.compile's own kernels reach for a bf16 head; what it saves is
peak memory (no fp32 chunk, no gradient buffer).

For an FP8 head (train.loss_kernel = "triton-e5m2") the row kernel only stores each row's log-sum-exp, and a
tiled kernel reads the logits again and writes the gradient as e5m2 at its static scale, row-major and
transposed: the layouts cuBLAS's FP8 GEMMs want for d/dh and d/dW. That replaces the in-place bf16 write, the
cast to e5m2 and its transposed copy, one Inductor kernel per chunk (bench/gpu_pretrain_profile.py shows its
share of the step).
"""
from __future__ import annotations

import torch

from scalelab.pretrain.fp8_kernels import E5M2_MAX, fp8_codes
from scalelab.pretrain.triton_support import INTERPRETED, require_triton, tl, triton

# The e5m2 gradient kernel's launch: (rows, columns) per tile, warps and rounding, the fastest timed alone
# (_ce_grad_e5m2)
E5M2_TILE, E5M2_TILE_WARPS, E5M2_HW_CAST = (32, 128), 4, True


def _ce_rows(logits_ptr, stride, targets_ptr, loss_ptr, lse_ptr, inv_n, VOCAB: tl.constexpr,
             PADDED: tl.constexpr, WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row. The sizes are compile-time constants: one vocabulary per run, static loop bounds."""
    row = tl.program_id(0).to(tl.int64)
    ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    m = tl.zeros([], tl.float32) - float("inf")
    s = tl.zeros([], tl.float32)
    for start in range(0, VOCAB, BLOCK):  # pass 1: running max and sum of exp, rescaled as the max grows
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(ptr + cols, mask=cols < VOCAB, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, lse - tl.load(ptr + target).to(tl.float32))  # read before pass 2 overwrites it
    if WANT_GRAD:
        for start in range(0, PADDED, BLOCK):  # pass 2: d(mean loss)/d(logits), in place
            cols = start + tl.arange(0, BLOCK)
            inside = cols < PADDED
            x = tl.load(ptr + cols, mask=inside, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
            g = tl.where(cols < VOCAB, g * inv_n, 0.0)
            tl.store(ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=inside)


def _ce_grad_e5m2(logits_ptr, stride, lse_ptr, targets_ptr, g8_ptr, g8t_ptr, rows, VOCAB: tl.constexpr,
                  PADDED: tl.constexpr, SCALE: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr, HW: tl.constexpr):
    """One program per (BR rows x BV columns) tile: (softmax - one_hot) * E5M2_MAX as e5m2 bytes, written row-major
    (for d/dh) and transposed (for d/dW: cuBLAS's FP8 GEMM wants both operands contiguous along the token axis).
    |softmax - one_hot| <= 1, so SCALE = E5M2_MAX is a static scale. On the GPU it rounds with the hardware's
    cast (HW): Triton (3.6, sm_90) then recomputes the tile's exp in the transposed store's layout and moves the
    bf16 logits through shared memory instead of the bytes (twice the exps, more registers; bench/
    triton_kernel_sass.py), yet timed alone (bench/gpu_row_kernels.py) it is still the faster, at a 32 x 128 tile
    and 4 warps; in the trainer the step moves by less than that time alone forecasts."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BV + tl.arange(0, BV)
    inside = (r[:, None] < rows) & (c[None, :] < PADDED)
    x = tl.load(logits_ptr + r[:, None].to(tl.int64) * stride + c[None, :], mask=inside, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + r, mask=r < rows, other=0.0)
    target = tl.load(targets_ptr + r, mask=r < rows, other=-1)
    g = tl.exp(x - lse[:, None]) - tl.where(c[None, :] == target[:, None], 1.0, 0.0)
    byte = fp8_codes(tl.where(c[None, :] < VOCAB, g * SCALE, 0.0), True, HW)
    tl.store(g8_ptr + r[:, None].to(tl.int64) * PADDED + c[None, :], byte, mask=inside)
    tl.store(g8t_ptr + c[None, :].to(tl.int64) * rows + r[:, None], byte, mask=inside)


# jitted at import, as module-level kernels torch.compile can place in its graph (triton_support.py: the interpreter)
_CE_ROWS = triton.jit(_ce_rows) if triton is not None else None
_CE_GRAD_E5M2 = triton.jit(_ce_grad_e5m2) if triton is not None else None


def _check(logits: torch.Tensor) -> None:
    require_triton(logits, "train.loss_kernel='triton'", "train.loss_kernel='torch'")
    if logits.stride(1) != 1:
        raise ValueError("the loss kernel needs logits with contiguous rows")


def cross_entropy_rows_(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, inv_n: float,
                        want_grad: bool, block: int = 4096) -> torch.Tensor:
    """Per-row loss (fp32, (rows,)) of logits (rows, Vp) against targets (rows,) over the first vocab_size
    columns; with want_grad, logits now hold (softmax - one_hot) * inv_n (0 in the padded columns)."""
    _check(logits)
    rows, padded = logits.shape
    loss, lse = torch.empty(2, rows, dtype=torch.float32, device=logits.device).unbind(0)
    _CE_ROWS[(rows,)](logits, logits.stride(0), targets, loss, lse, inv_n, VOCAB=vocab_size, PADDED=padded,
                       WANT_GRAD=want_grad, BLOCK=block)
    return loss


def cross_entropy_rows_e5m2(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, block: int = 4096,
                            tile: tuple[int, int] = E5M2_TILE, tile_warps: int = E5M2_TILE_WARPS,
                            hw_cast: bool = E5M2_HW_CAST) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For an FP8 head: (per-row loss (rows,), g8 (rows, Vp), g8t (Vp, rows)) with g8 = e5m2 of (softmax -
    one_hot) * E5M2_MAX over the first vocab_size columns (0 in the padded ones) and g8t its transpose; the
    gradient of the mean loss over N rows is g8 / (E5M2_MAX * N). The logits are read twice and left unchanged;
    the bf16 gradient, its cast and its transposed copy are never written. hw_cast: round with the hardware's cast
    (the faster on an H200 though it doubles the exps, _ce_grad_e5m2 says why; bench/gpu_row_kernels.py times
    both); the interpreter always rounds in integers."""
    _check(logits)
    rows, padded = logits.shape
    loss, lse = torch.empty(2, rows, dtype=torch.float32, device=logits.device).unbind(0)
    _CE_ROWS[(rows,)](logits, logits.stride(0), targets, loss, lse, 0.0, VOCAB=vocab_size, PADDED=padded,
                       WANT_GRAD=False, BLOCK=block)
    g8 = torch.empty(rows, padded, dtype=torch.uint8, device=logits.device)
    g8t = torch.empty(padded, rows, dtype=torch.uint8, device=logits.device)
    grid = (triton.cdiv(rows, tile[0]), triton.cdiv(padded, tile[1]))
    _CE_GRAD_E5M2[grid](logits, logits.stride(0), lse, targets, g8, g8t, rows, VOCAB=vocab_size, PADDED=padded,
                        SCALE=E5M2_MAX, BR=tile[0], BV=tile[1], HW=hw_cast and not INTERPRETED,
                        num_warps=tile_warps)
    return loss, g8.view(torch.float8_e5m2), g8t.view(torch.float8_e5m2)
