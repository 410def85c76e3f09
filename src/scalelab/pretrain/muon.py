"""Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks", kellerjordan.github.io/
posts/muon; Liu et al. 2025, "Muon is scalable for LLM training", arXiv:2502.16982) for the transformer's hidden
weight matrices, fused AdamW for everything else (train.optimizer = "muon").

Muon is momentum SGD whose step for a weight matrix W (out, in) is the momentum's nearest semi-orthogonal matrix
U V^T (from its SVD U S V^T): every direction the gradient points along moves by the same amount, instead of the
few dominant ones taking almost all of the step. U V^T is approximated by 5 Newton-Schulz iterations in bf16.
Embeddings, the (tied) LM head, biases and LayerNorm gains are not hidden matrices and stay on AdamW, as in
modded-nanogpt and Moonlight.

Distributed: under DDP every rank holds the same all-reduced gradient, so every rank computes the same update
with no extra communication. Under FSDP2 a rank holds a row shard of each matrix; the orthogonalization needs the
whole matrix, so each rank all-gathers the momentum-corrected gradient in bf16 (what the iteration runs in: the
same bytes as FSDP2's own bf16 forward all-gather of those matrices, once per step), orthogonalizes it and keeps
its own rows. Every rank repeats the same Newton-Schulz work: ~1.6 TFLOP per step at 124M (5 iterations of 3
matmuls on 48 matrices), against ~450 TFLOP of forward and backward for a 0.5M-token step.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn as nn

# Quintic Newton-Schulz coefficients (Jordan 2024). One iteration X <- a X + b (X X^T) X + c (X X^T)^2 X maps
# X = U S V^T to U p(S) V^T with p(s) = a s + b s^3 + c s^5: same singular vectors, each singular value sent
# through the odd polynomial p. X starts as G / ||G||_F, so every s is in (0, 1]. The textbook choice
# (15/8, -10/8, 3/8) has p(1) = 1, p'(1) = 0 (converges to exactly 1) but slope 1.875 at 0, too slow for the
# small singular values of a gradient in 5 steps. These coefficients maximize the slope at 0 (a = 3.4445: a small
# s grows ~3.4x per step, ~480x in 5) while keeping the iterates bounded: p maps [0.68, 1.2] into itself
# (p(1) = 0.701, max of p on [0, 1] = 1.202 at s = 0.555), so after 5 steps every s >= 3e-3 of the Frobenius norm
# lands in ~[0.68, 1.20] (computed by iterating p on a grid; tests/pretrain/test_muon.py checks it on a
# matrix). Not converging to exactly 1 costs nothing measurable in training (Jordan 2024); the speed does matter.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16):
    """g (..., m, n) -> approximately U V^T of each matrix's SVD, singular values in ~[0.68, 1.2]. Runs in bf16
    (Jordan 2024: the iteration is stable under bf16 rounding, so it runs on bf16 tensor cores); dtype is for
    tests of the arithmetic."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # iterate on the wide side: the Gram matrix x x^T is then the smaller (min, min) one
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)  # Frobenius >= spectral norm: every s <= 1
    for _ in range(steps):
        gram = x @ x.mT                         # (..., min, min)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def shape_scale(rows: int, cols: int) -> float:
    """Multiplier of the orthogonalized update of a (rows=out, cols=in) matrix: sqrt(max(1, rows/cols)), the
    scaling of Jordan's reference Muon and modded-nanogpt. An orthogonal (rows, cols) update has RMS
    1/sqrt(max(rows, cols)); the factor lifts tall matrices (the MLP's c_fc, 3072 x 768: x2) so the update's
    spectral norm follows sqrt(fan_out / fan_in), the feature-learning condition of Yang, Simon & Bernstein
    2023. We use it rather than Liu et al.'s AdamW-RMS matching (0.2 * sqrt(max(rows, cols))) because Muon's lr
    here is its own field and the published lr 0.02 / momentum 0.95 / 5 steps were tuned with this scaling on
    exactly GPT-2 124M shapes and a 0.5M-token batch (modded-nanogpt); RMS matching exists to reuse AdamW's lr
    and weight decay unchanged, which we do not need."""
    return max(1.0, rows / cols) ** 0.5


def orthogonalize(mats: list[torch.Tensor], split: int, steps: int) -> list[torch.Tensor]:
    """Orthogonalized, shape-scaled updates of (rows, cols) matrices. Each matrix is treated as `split` stacked
    (rows/split, cols) blocks orthogonalized apart (3 for the fused q/k/v of c_attn: each projection is its own
    linear map, as if it were a separate nn.Linear). Equal shapes are stacked into one batched iteration."""
    out: list[torch.Tensor | None] = [None] * len(mats)
    by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, m in enumerate(mats):
        by_shape[tuple(m.shape)].append(i)
    for (rows, cols), idx in by_shape.items():
        blocks = torch.stack([mats[i] for i in idx]).view(len(idx) * split, rows // split, cols)
        o = newton_schulz(blocks, steps) * shape_scale(rows // split, cols)
        for i, u in zip(idx, o.view(len(idx), rows, cols).unbind(0)):
            out[i] = u
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole matrix on this rank: FSDP2's DTensor shard is all-gathered; a plain tensor is itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local_like(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The part of `full` that p holds: for an FSDP2 shard, this rank's rows (a local slice, no communication)."""
    if not hasattr(p, "device_mesh"):
        return full
    from torch.distributed.tensor import DTensor, Replicate  # lazy: a heavy torch submodule, needed only here
    mesh = p.device_mesh
    return DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False).redistribute(mesh, p.placements)


class Muon(torch.optim.Optimizer):
    """Nesterov momentum, then the update of each 2-D parameter replaced by its orthogonalization.
    Group options: lr, momentum, ns_steps, weight_decay (decoupled, p *= 1 - lr * wd), split (see orthogonalize)."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, ns_steps: int = 5,
                 weight_decay: float = 0.0, split: int = 1):
        super().__init__(params, dict(lr=lr, momentum=momentum, ns_steps=ns_steps, weight_decay=weight_decay,
                                      split=split))
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2 or p.shape[0] % group["split"]:
                    raise ValueError(f"Muon takes 2-D matrices whose rows divide by split={group['split']}; "
                                     f"got a parameter of shape {tuple(p.shape)}: give it to AdamW")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            updates = orthogonalize([_full(self._nesterov(p, group["momentum"]).bfloat16()) for p in params],
                                    group["split"], group["ns_steps"])
            for p, u in zip(params, updates):
                if group["weight_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                p.add_(_local_like(u.to(p.dtype), p), alpha=-group["lr"])
        return loss

    def _nesterov(self, p: torch.Tensor, momentum: float) -> torch.Tensor:
        """buf <- momentum * buf + g; returns g + momentum * buf (Nesterov form of torch.optim.SGD)."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf = state["momentum_buffer"]
        buf.mul_(momentum).add_(p.grad)
        return p.grad.add(buf, alpha=momentum)


class MuonWithAdamW:
    """The two optimizers stepped as one. It exposes what the trainer uses (param_groups, step, zero_grad) and
    iterates over both, which is what torch.distributed.checkpoint's get_state_dict / set_state_dict accept for
    several optimizers: the checkpoint holds both states keyed by parameter name, so resume is exact."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW):
        self.optimizers = (muon, adamw)

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def __iter__(self):
        return iter(self.optimizers)


def split_params(model: nn.Module) -> tuple[list, list, list, list]:
    """(fused qkv matrices, other hidden matrices, embeddings/head, biases and gains). Hidden matrices are the
    weights of nn.Linear layers (FP8Linear included) that are not tied to an embedding: attention c_attn/c_proj,
    MLP c_fc/c_proj. The LM head shares wte's weight, so it falls with the embeddings."""
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    qkv, hidden = [], []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and id(m.weight) not in embedding and m.weight.requires_grad:
            (qkv if name.endswith("c_attn") else hidden).append(m.weight)
    taken = {id(p) for p in qkv + hidden}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    return qkv, hidden, [p for p in rest if p.dim() >= 2], [p for p in rest if p.dim() < 2]


def build_muon_adamw(model: nn.Module, cfg, fused: bool) -> MuonWithAdamW:
    """Muon on the hidden matrices at optim.muon_lr; AdamW (fused on CUDA) at optim.lr on the rest, with decay on
    the 2-D embedding only (as the AdamW recipe). Each group carries lr_ratio = its peak lr / optim.lr, which the
    trainer multiplies into the scheduled lr, so one warmup/decay schedule drives both optimizers."""
    o = cfg.optim
    qkv, hidden, matrices, vectors = split_params(model)
    common = dict(momentum=o.muon_momentum, ns_steps=o.muon_ns_steps, weight_decay=o.muon_weight_decay,
                  lr=o.muon_lr, lr_ratio=o.muon_lr / o.lr)
    groups = [g for g in ({"params": qkv, "split": 3, **common}, {"params": hidden, "split": 1, **common})
              if g["params"]]
    muon = Muon(groups)
    adamw = torch.optim.AdamW([{"params": matrices, "weight_decay": o.weight_decay, "lr_ratio": 1.0},
                               {"params": vectors, "weight_decay": 0.0, "lr_ratio": 1.0}],
                              lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused)
    return MuonWithAdamW(muon, adamw)
