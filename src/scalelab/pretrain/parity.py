"""Parity: the same weights in our GPT and in HF `GPT2LMHeadModel` give the same logits and loss.

HF's model is built from a config (random init, seeded; nothing is downloaded), its weights are copied
into ours through the one shared mapping (weights_map.py), and both run on the same random tokens. HF runs
its eager attention (explicit mask + softmax), an implementation independent of our fused SDPA call,
so agreement checks the math, not one kernel against itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from scalelab.pretrain.config import ModelConfig
from scalelab.pretrain.train_gpt import GPT
from scalelab.pretrain.weights_map import gpt2_config, load_into_ours

# Stated tolerances on max |Δlogit| and |Δloss|. Measured on this CPU (torch 2.13, transformers 5.24, seeds 0-2):
#   2 layers x 64, T=32, B=2:   fp32 |Δlogits| 2.4e-7..3.0e-7, |Δloss| <= 9.5e-7;  fp64 5.6e-16, 0
#   GPT-2 124M, T=16, B=1:      fp32 |Δlogits| 1.8e-6..2.0e-6, |Δloss| <= 9.5e-7;  fp64 8.4e-15..9.3e-15, 0
# (|logits| up to ~1 and ~2.7). The fp32 bounds leave ~50x / ~10x headroom for other BLAS/SDPA kernels and
# summation orders; fp64 agreement to 1e-14 shows the fp32 residue is rounding, not a mapping error (on the
# small model, one c_fc weight moved by 0.05 gives |Δlogits| 1.3e-2; an untransposed c_proj gives 0.44).
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-10)}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index, also HF's label padding value


@dataclass(frozen=True)
class ParityResult:
    dtype: str
    n_layer: int
    n_embd: int
    batch: int
    seq_len: int
    max_abs_logits_diff: float
    max_abs_logit: float          # scale of the logits compared: random init gives |logit| ~ 0.5
    abs_loss_diff: float
    loss_ours: float
    loss_hf: float
    logits_tolerance: float
    loss_tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_abs_logits_diff <= self.logits_tolerance and self.abs_loss_diff <= self.loss_tolerance


def build_pair(model_cfg: ModelConfig, seed: int, dtype: str = "float32"):
    """(our GPT, HF GPT2LMHeadModel) holding the same seeded random weights, in eval mode and `dtype`."""
    from transformers import GPT2LMHeadModel  # lazy: transformers takes seconds to import
    hf_cfg = gpt2_config(model_cfg)
    with torch.random.fork_rng(devices=[]):  # HF init draws from the global RNG: keep the caller's untouched
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel._from_config(hf_cfg, attn_implementation="eager")
        ours = GPT(model_cfg)
    load_into_ours(ours, hf.state_dict())
    return ours.to(DTYPES[dtype]).eval(), hf.to(DTYPES[dtype]).eval()


def random_tokens(model_cfg: ModelConfig, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model_cfg.vocab_size, (batch, seq_len), generator=gen)  # (B, T)


@torch.no_grad()
def measure_parity(ours: GPT, hf, tokens: torch.Tensor, dtype: str = "float32") -> ParityResult:
    """Run both models on `tokens` (B, T); each computes its own next-token loss over the first T-1 positions."""
    targets = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], IGNORE_INDEX)], dim=1)  # (B, T)
    logits_ours, loss_ours = ours(tokens, targets)
    out = hf(input_ids=tokens, labels=tokens)  # HF shifts labels by one inside
    diff = (logits_ours - out.logits).abs().max().item()
    logit_tol, loss_tol = TOLERANCES[dtype]
    return ParityResult(dtype=dtype, n_layer=ours.cfg.n_layer, n_embd=ours.cfg.n_embd, batch=tokens.shape[0],
                        seq_len=tokens.shape[1], max_abs_logits_diff=diff,
                        max_abs_logit=out.logits.abs().max().item(),
                        abs_loss_diff=abs(loss_ours.item() - out.loss.item()), loss_ours=loss_ours.item(),
                        loss_hf=out.loss.item(), logits_tolerance=logit_tol, loss_tolerance=loss_tol)


def run_parity(model_cfg: ModelConfig, dtype: str = "float32", seed: int = 0, batch: int = 2,
               seq_len: int | None = None) -> ParityResult:
    """Seeded HF init -> copy into ours -> compare on one random batch of `seq_len` (default block_size) tokens."""
    if dtype not in DTYPES:
        raise ValueError(f"parity dtype {dtype!r}: allowed values: {', '.join(map(repr, DTYPES))}")
    seq_len = seq_len or model_cfg.block_size
    ours, hf = build_pair(model_cfg, seed, dtype)
    return measure_parity(ours, hf, random_tokens(model_cfg, batch, seq_len, seed + 1), dtype)


def format_parity(r: ParityResult) -> str:
    verdict = "PASS" if r.passed else "FAIL"
    return (f"parity {verdict} ({r.dtype}, {r.n_layer} layers x {r.n_embd}, B={r.batch} T={r.seq_len}): "
            f"max |dlogits| {r.max_abs_logits_diff:.3e} (tol {r.logits_tolerance:.0e}, |logit| <= "
            f"{r.max_abs_logit:.2f}); |dloss| {r.abs_loss_diff:.3e} (tol {r.loss_tolerance:.0e}; "
            f"ours {r.loss_ours:.6f}, HF {r.loss_hf:.6f})")

