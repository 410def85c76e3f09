"""The LM head over completion positions: each token's log-probability under softmax(logits / T) and the policy's
entropy there, a chunk of rows at a time, with a backward that recomputes the chunk's logits.

A 151,936-token vocabulary makes the head's logits the largest tensors of the update: one chunk of 2,048 rows is
1.2 GB in fp32. So no chunk is kept for the backward (the idea of Liger's fused linear cross-entropy, Hsu et al.
2024): the forward keeps each row's log-sum-exp, and the backward computes the logits again and turns them into
the gradient directly,

    d logp_t / d logits_j = (onehot(t)_j - softmax(logits / T)_j) / T,

which is one pass over the chunk; re-running the forward under autograd (torch.utils.checkpoint) would redo the
log-sum-exp and the entropy and then backpropagate through them. The row statistics (log-sum-exp, target logit,
entropy) and the gradient are each one elementwise pass over the chunk; `compiled` hands them to torch.compile,
which fuses each into a kernel that reads the bf16 logits once instead of making fp32 copies of them.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F


def row_stats(logits: torch.Tensor, targets: torch.Tensor, inv_t: float,
              entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-sum-exp, target logit, entropy or None) per row of logits / T, in fp32."""
    z = logits.float()
    if inv_t != 1.0:
        z = z * inv_t
    lse = torch.logsumexp(z, dim=-1)
    z_t = z.gather(1, targets[:, None]).squeeze(1)
    if not entropy:
        return lse, z_t, None
    logp = z - lse[:, None]
    return lse, z_t, -(logp.exp() * logp).sum(-1)


def logits_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, dlogp: torch.Tensor,
                inv_t: float) -> torch.Tensor:
    """d(sum_r dlogp_r * logp_r)/d logits in the logits' dtype: dlogp_r * (onehot - softmax) / T per row."""
    z = logits.float()
    if inv_t != 1.0:
        z = z * inv_t
    cols = torch.arange(logits.shape[1], device=logits.device)
    onehot = (cols[None, :] == targets[:, None]).float()
    return ((onehot - torch.exp(z - lse[:, None])) * (dlogp * inv_t)[:, None]).to(logits.dtype)


class HeadOps:
    """The two elementwise passes, eager or compiled (one graph per entropy setting; rows vary, so dynamic)."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        wrap: Callable = _compiled_or_eager if compiled else (lambda f: f)
        self.stats, self.grad = wrap(row_stats), wrap(logits_grad)


def _compiled_or_eager(fn: Callable) -> Callable:
    """torch.compile(fn), falling back to fn itself, with a warning, if the compiler fails: an optimization
    must not end a run on a lent GPU (a different torch there, a missing compiler)."""
    compiled, state = torch.compile(fn, dynamic=True), {"ok": True}

    def call(*args: Any) -> Any:
        if state["ok"]:
            try:
                return compiled(*args)
            except Exception as e:  # noqa: BLE001 - any compiler error; a real fault fails again eagerly below
                state["ok"] = False
                warnings.warn(f"optim.compile_head: torch.compile of {fn.__name__} failed ({type(e).__name__}: "
                              f"{str(e)[:200]}); it runs eagerly", RuntimeWarning, stacklevel=2)
        return fn(*args)
    return call


EAGER = HeadOps(False)
_COMPILED: HeadOps | None = None


def head_ops(compiled: bool) -> HeadOps:
    global _COMPILED
    if not compiled:
        return EAGER
    if _COMPILED is None:  # compiled once per process, on first use
        _COMPILED = HeadOps(True)
    return _COMPILED


class ChunkLogprob(torch.autograd.Function):
    """logp (rows,) of a chunk, differentiable in h and the head weight; the entropy (rows,) or an empty tensor
    as a second, non-differentiable output."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, entropy: bool, ops: HeadOps) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _logits(h, weight, bias)
        lse, z_t, ent = ops.stats(logits, targets, 1.0 / temperature, entropy)
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.inv_t, ctx.ops = 1.0 / temperature, ops
        ent = ent if ent is not None else lse.new_zeros(0)
        ctx.mark_non_differentiable(ent)
        return z_t - lse, ent

    @staticmethod
    def backward(ctx: Any, dlogp: torch.Tensor, _dent: torch.Tensor) -> tuple:
        h, weight, bias, targets, lse = ctx.saved_tensors
        g = ctx.ops.grad(_logits(h, weight, bias), targets, lse, dlogp.float(), ctx.inv_t)  # (rows, V), h's dtype
        dh = g @ weight.to(h.dtype) if ctx.needs_input_grad[0] else None
        dw = (g.t() @ h).to(weight.dtype) if ctx.needs_input_grad[1] else None
        db = g.sum(0).to(bias.dtype) if ctx.needs_input_grad[2] else None
        return dh, dw, db, None, None, None, None


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(h, weight.to(h.dtype), None if bias is None else bias.to(h.dtype))


def head_logprobs(head: Any, h: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int,
                  entropy: bool, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(h) / T) at `targets` for h (tokens, d), `rows` tokens at a time, and the entropy (no
    graph) when asked; positions that are prompt or padding never reach the head. `head` is a linear layer (an HF
    LM head)."""
    ops = head_ops(compiled)
    lps, ents = [], []
    for s in range(0, h.shape[0], rows):
        lp, ent = ChunkLogprob.apply(h[s:s + rows], head.weight, getattr(head, "bias", None), targets[s:s + rows],
                                     temperature, entropy, ops)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        return h.new_zeros(0, dtype=torch.float32), (h.new_zeros(0, dtype=torch.float32) if entropy else None)
    return torch.cat(lps), torch.cat(ents) if entropy else None
