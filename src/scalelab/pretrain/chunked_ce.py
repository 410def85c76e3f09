"""LM-head matmul + cross-entropy over row chunks, gradient computed in the forward pass (train.loss_chunks).

The plain head materializes the (B*T, V) logits, kept from the forward to the backward, and under torch.compile
their gradient in fp32: at B=64, T=1024, V=50304, 6.6 GB of bf16 logits and 13 GB of fp32 gradient
(predict.compiled_logits_bytes). Here each chunk of rows goes logits -> loss -> d(loss)/d(logits) -> d/dh and
d/dW at once (the idea of Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024), so only one chunk's
(rows, V) buffers exist at a time and nothing of size B*T*V outlives the forward. The FLOPs are the same three
head matmuls.

Why it can pay on an H200: not for memory (124M at B=64 peaks at 41 GB of 141; the ~16 GB saved at 8 chunks
matters on smaller GPUs or larger vocabularies) but for HBM traffic: under torch.compile the softmax, the one-hot
subtraction, the 1/N and the cast to bf16 fuse into one pass per chunk, so the 13 GB fp32 gradient is never written
and read back, ~5 ms at 4.8 TB/s of a ~127 ms 65k-token micro-step (~4%). In eager mode those are separate passes
and it is slower. The gain is to be measured (bench/gpu_pretrain_variants.sh plain chunks8), not assumed.
"""
from __future__ import annotations

import torch


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the head matmul would run in: autocast's when it is on (bf16 on GPU), else the input's."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(h_i @ W.T, t_i) with the softmax restricted to the first `vocab_size` of W's rows.
    Forward saves d(loss)/dh (N, C) and d(loss)/dW (Vp, C) instead of the logits; backward scales them."""

    @staticmethod
    def forward(ctx, h, weight, targets, n_chunks: int, vocab_size: int, dtype: torch.dtype, want_grad: bool):
        # h (N, C) float; weight (Vp, C); targets (N,) int64. Matmuls in `dtype`, softmax in fp32, like the plain
        # path (bf16 autocast matmul, then logits.float()).
        n = h.size(0)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(h) if want_grad else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_grad else None
            cols = torch.arange(weight.size(0), device=h.device)    # (Vp,)
            rows = -(-n // n_chunks)                                 # ceil: torch.chunk's split
            for s in range(0, n, rows):
                hc, tc = h[s:s + rows].to(dtype), targets[s:s + rows]
                # pointwise from here to the matmuls, so torch.compile fuses each line into one pass over the chunk
                logits = (hc @ w.t()).float().masked_fill(cols >= vocab_size, float("-inf"))  # (rows, Vp)
                lse = torch.logsumexp(logits, dim=-1)                # (rows,)
                loss += (lse - logits.gather(1, tc[:, None]).squeeze(1)).sum()
                if not want_grad:
                    continue
                # d(mean loss)/d(logits) = (softmax - one_hot) / N; padded columns: exp(-inf) = 0
                g = (((logits - lse[:, None]).exp() - (cols == tc[:, None]).float()) / n).to(dtype)
                grad_h[s:s + rows] = g @ w
                grad_w += (g.t() @ hc).float()
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w)
            ctx.weight_dtype = weight.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, (grad_w * grad_out).to(ctx.weight_dtype), None, None, None, None, None


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, n_chunks: int,
                          vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy of logits h @ weight.T (first vocab_size columns) against targets, never holding more
    than one chunk of logits. h (B, T, C), weight (Vp, C), targets (B, T) -> scalar; same value and gradients as
    F.cross_entropy(F.linear(h, weight)[..., :vocab_size].float().view(-1, vocab_size), targets.view(-1))."""
    h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    dtype = _compute_dtype(h.device.type, h.dtype)
    return _ChunkedLinearCrossEntropy.apply(h2, weight, t, n_chunks, vocab_size, dtype, want_grad)
