"""LM-head matmul + cross-entropy over row chunks, gradient computed in the forward pass (train.loss_chunks).

The plain head materializes the (B*T, V) logits, kept from the forward to the backward, and under torch.compile
their gradient in fp32: at B=64, T=1024, V=50304, 6.6 GB of bf16 logits and 13 GB of fp32 gradient
(predict.compiled_logits_bytes). Here each chunk of rows goes logits -> loss -> d(loss)/d(logits) -> d/dh and
d/dW at once (the idea of Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024), so only one chunk's
(rows, V) buffers exist at a time and nothing of size B*T*V outlives the forward. The FLOPs are the same three
head matmuls; with an FP8 head (train.fp8 'lm_head' or 'all') they run in FP8 as fp8.py's FP8Linear would, with
each chunk's rows quantized on their own.

Why it can pay on an H200: not for memory (124M at B=64 peaks at 41 GB of 141; the ~16 GB saved at 8 chunks
matters on smaller GPUs or larger vocabularies) but for HBM traffic: under torch.compile the softmax, the one-hot
subtraction, the 1/N and the cast to bf16 fuse into one pass per chunk, so the 13 GB fp32 gradient is never written
and read back, ~5 ms at 4.8 TB/s of a ~127 ms 65k-token micro-step (~4%). In eager mode those are separate passes
and it is slower. The gain is to be measured (bench/gpu_pretrain_variants.sh plain chunks8), not assumed.
"""
from __future__ import annotations

import torch

from scalelab.pretrain.ce_kernel import cross_entropy_rows_, cross_entropy_rows_e5m2
from scalelab.pretrain.fp8 import E4M3, E5M2, mm8, quantize
from scalelab.pretrain.fp8_kernels import E5M2_MAX

KERNELS = ("torch", "triton", "triton-e5m2")  # train.loss_kernel's values


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the head matmul would run in: autocast's when it is on (bf16 on GPU), else the input's."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else dtype


class _Head:
    """The head's three matmuls in `dtype` (bf16 under autocast): logits, d/dh and d/dW of one chunk."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype):
        self.w, self.dtype = w, dtype

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        return h.to(self.dtype)

    def logits(self, hc: torch.Tensor) -> torch.Tensor:
        return hc @ self.w.t()

    def grad_logits(self, g: torch.Tensor) -> torch.Tensor:
        return g.to(self.dtype)

    def grad_rows(self, g: torch.Tensor) -> torch.Tensor:
        return g @ self.w

    def grad_weight(self, g: torch.Tensor, hc: torch.Tensor) -> torch.Tensor:
        return (g.t() @ hc).float()


class _Fp8Head:
    """The same three matmuls in FP8 (train.fp8 'lm_head'/'all', fp8.py's recipe): the weight and each chunk's
    rows in e4m3 with per-tensor dynamic scales, the weight quantized once per call. The logit gradient goes to
    e5m2 with a static scale: |softmax - one_hot| / N <= 1/N, so its amax is known and the pass that would
    measure it (a full read of the chunk) is not needed."""

    def __init__(self, w: torch.Tensor, fast_accum: bool, n: int):
        self.w8, self.sw = quantize(w, E4M3)
        self.grad_amax = 1.0 / n
        self.w8_cols = self.w8.t().contiguous().t()  # column-major copy for d/dh, made once rather than per chunk
        self.fast_accum = fast_accum

    def rows(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize(h, E4M3)

    def logits(self, hc: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return mm8(hc[0], hc[1], self.w8.t(), self.sw, torch.bfloat16, self.fast_accum)

    def grad_logits(self, g: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """(g8, 1/scale, g8 transposed or None). A tuple is the loss kernel's (g8, g8t), already in e5m2 at
        the same static scale E5M2_MAX * N (ce_kernel.cross_entropy_rows_e5m2)."""
        if isinstance(g, tuple):
            inv = torch.full((), 1.0 / (E5M2_MAX / self.grad_amax), dtype=torch.float32, device=g[0].device)
            return g[0], inv, g[1]
        return (*quantize(g, E5M2, self.grad_amax), None)

    def grad_rows(self, g: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return mm8(g[0], g[1], self.w8_cols, self.sw, torch.bfloat16)

    def grad_weight(self, g: tuple[torch.Tensor, ...], hc: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return mm8(g[0].t() if g[2] is None else g[2], g[1], hc[0], hc[1], torch.float32)


def _loss_and_grad(logits: torch.Tensor, tc: torch.Tensor, cols: torch.Tensor, vocab_size: int, n: int,
                   want_grad: bool, kernel: str, fp8: bool) -> tuple[torch.Tensor, torch.Tensor | tuple | None]:
    """(sum of the chunk's row losses, d(mean loss)/d(logits) or None) for logits (rows, Vp) from the head; with
    kernel 'triton-e5m2' and an FP8 head the gradient comes as (g8, g8t) at _Fp8Head's static scale."""
    if kernel == "triton-e5m2" and fp8 and want_grad:  # e5m2 in both layouts: no bf16 gradient, cast or copy
        loss, g8, g8t = cross_entropy_rows_e5m2(logits, tc, vocab_size)
        return loss.sum(), (g8, g8t)
    if kernel != "torch":  # the Triton kernel: the gradient replaces the logits in place (ce_kernel.py)
        return cross_entropy_rows_(logits, tc, vocab_size, 1.0 / n, want_grad).sum(), logits if want_grad else None
    # pointwise from here on, so torch.compile fuses each line into one pass over the chunk
    logits = logits.float().masked_fill(cols >= vocab_size, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                    # (rows,)
    loss = (lse - logits.gather(1, tc[:, None]).squeeze(1)).sum()
    if not want_grad:
        return loss, None
    # d(mean loss)/d(logits) = (softmax - one_hot) / N; padded columns: exp(-inf) = 0
    return loss, ((logits - lse[:, None]).exp() - (cols == tc[:, None]).float()) / n


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(h_i @ W.T, t_i) with the softmax restricted to the first `vocab_size` of W's rows.
    Forward saves d(loss)/dh (N, C) and d(loss)/dW (Vp, C) instead of the logits; backward scales them."""

    @staticmethod
    def forward(ctx, h, weight, targets, n_chunks: int, vocab_size: int, dtype: torch.dtype, want_grad: bool,
                fp8: bool, fast_accum: bool, kernel: str):
        # h (N, C) float; weight (Vp, C); targets (N,) int64. Matmuls in `dtype` (or FP8), softmax in fp32, like the
        # plain path (bf16 autocast matmul, then logits.float()).
        n = h.size(0)
        with torch.autocast(h.device.type, enabled=False):
            mm = _Fp8Head(weight, fast_accum, n) if fp8 else _Head(weight.to(dtype), dtype)
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(h) if want_grad else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_grad else None
            cols = torch.arange(weight.size(0), device=h.device)    # (Vp,)
            rows = -(-n // n_chunks)                                 # ceil: torch.chunk's split
            for s in range(0, n, rows):
                hc, tc = mm.rows(h[s:s + rows]), targets[s:s + rows]
                chunk_loss, g = _loss_and_grad(mm.logits(hc), tc, cols, vocab_size, n, want_grad, kernel, fp8)
                loss += chunk_loss
                if not want_grad:
                    continue
                g = mm.grad_logits(g)
                grad_h[s:s + rows] = mm.grad_rows(g)
                grad_w += mm.grad_weight(g, hc)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w)
            ctx.weight_dtype = weight.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, (grad_w * grad_out).to(ctx.weight_dtype), *[None] * 8


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, n_chunks: int,
                          vocab_size: int, fp8: bool = False, fast_accum: bool = False,
                          kernel: str = "torch") -> torch.Tensor:
    """Mean cross-entropy of logits h @ weight.T (first vocab_size columns) against targets, never holding more
    than one chunk of logits. h (B, T, C), weight (Vp, C), targets (B, T) -> scalar; same value and gradients as
    F.cross_entropy(F.linear(h, weight)[..., :vocab_size].float().view(-1, vocab_size), targets.view(-1)).
    fp8: the head's matmuls in FP8 (fp8.py), as an FP8Linear head would be; fast_accum for its forward GEMM.
    kernel (train.loss_kernel): 'torch' (compiled torch ops), 'triton' (each chunk's loss and gradient in one Triton
    kernel, ce_kernel.py) or 'triton-e5m2' (with fp8, that kernel writes the logit gradient as e5m2 itself, in both
    layouts the two gradient GEMMs want, instead of bf16 that is then cast and transposed)."""
    if kernel not in KERNELS:
        raise ValueError(f"chunked_cross_entropy: kernel={kernel!r}, expected one of {KERNELS}")
    h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    dtype = _compute_dtype(h.device.type, h.dtype)
    return _ChunkedLinearCrossEntropy.apply(h2, weight, t, n_chunks, vocab_size, dtype, want_grad, fp8, fast_accum,
                                            kernel)
