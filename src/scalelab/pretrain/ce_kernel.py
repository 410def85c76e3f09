"""One Triton kernel for a chunk of the chunked loss (train.loss_kernel = "triton"): per row, the log-sum-exp
over the real vocabulary, the row's loss, and the gradient (softmax - one_hot) / N written over the logits.

Each row is read twice (online max/sum-exp, Milakov & Gimelshein 2018; then the gradient) and written once, in
place, as Liger-Kernel's cross-entropy does (Hsu et al. 2024), so no fp32 copy of the chunk and no separate
gradient buffer exist. Padded vocab columns get exactly zero gradient and are outside the softmax.
Measured on an H200 (results/h200/pretrain_variants_round3.json, 124M at B=128, 8 chunks of 16k x 50k): 1.56 ms
per chunk (~3 TB/s), about the speed torch.compile's own kernels already reached for a bf16 head (+0.5% tokens/s
with the FP8 head), and ~10 GiB less peak memory (43.5 -> 31.7 GiB with FP8 in the blocks).

Without the triton package (CPU-only installs) the trainer still imports; asking for the kernel is an error.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the trainer imports; the kernel is refused when asked for
    triton = tl = None


def _ce_rows(logits_ptr, stride, targets_ptr, loss_ptr, inv_n, VOCAB: tl.constexpr, PADDED: tl.constexpr,
             WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
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
    tl.store(loss_ptr + row, lse - tl.load(ptr + target).to(tl.float32))  # read before pass 2 overwrites it
    if WANT_GRAD:
        for start in range(0, PADDED, BLOCK):  # pass 2: d(mean loss)/d(logits), in place
            cols = start + tl.arange(0, BLOCK)
            inside = cols < PADDED
            x = tl.load(ptr + cols, mask=inside, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
            g = tl.where(cols < VOCAB, g * inv_n, 0.0)
            tl.store(ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=inside)


# jitted at import, as a module-level kernel torch.compile can place in its graph; TRITON_INTERPRET=1 must be set
# before this import to interpret it on CPU (Triton wraps its own library functions when it is imported)
_CE_ROWS = triton.jit(_ce_rows) if triton is not None else None


def cross_entropy_rows_(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, inv_n: float,
                        want_grad: bool, block: int = 4096) -> torch.Tensor:
    """Per-row loss (fp32, (rows,)) of logits (rows, Vp) against targets (rows,) over the first vocab_size
    columns; with want_grad, logits now hold (softmax - one_hot) * inv_n (0 in the padded columns)."""
    if _CE_ROWS is None:
        raise RuntimeError("train.loss_kernel='triton' needs the triton package (CUDA builds of torch bring it)")
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"train.loss_kernel='triton' runs on CUDA, not on {logits.device}; use "
                           "train.loss_kernel='torch' (or TRITON_INTERPRET=1 to interpret the kernel, slowly)")
    if logits.stride(1) != 1:
        raise ValueError("cross_entropy_rows_ needs logits with contiguous rows")
    rows, padded = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _CE_ROWS[(rows,)](logits, logits.stride(0), targets, loss, inv_n, VOCAB=vocab_size, PADDED=padded,
                       WANT_GRAD=want_grad, BLOCK=block)
    return loss
