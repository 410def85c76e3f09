"""GRPO's advantages and its clipped, token-level policy-gradient loss.

    A_i      = (r_i - mean(r_group)) / (std(r_group) + eps)           GRPO (Shao et al. 2024, DeepSeekMath, eq. 3)
    A_i      =  r_i - mean(r_group)                                   Dr. GRPO (Liu et al. 2025): no std division
    rho_t    = pi_theta(o_t) / pi_old(o_t)
    l_t      = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A)  PPO clip (Schulman et al. 2017, eq. 7)
    kl_t     = exp(ref_t - logp_t) - (ref_t - logp_t) - 1           k3 (Schulman 2020, "Approximating KL divergence")
    w_t      = min(pi_old(o_t) / pi_behavior(o_t), C)               truncated IS (V-trace, Espeholt et al. 2018)
    loss_t   = w_t * l_t + beta * kl_t

The std is Bessel-corrected (torch.std's default, as TRL's GRPOTrainer), so a hand computation must divide
by G - 1. A group whose rewards are all equal gets advantage 0 and contributes no policy gradient.

Aggregation (which tokens weigh how much) is a registry. The default is `token_mean`: every response token of
the optimizer step weighs the same (DAPO, Yu et al. 2025, section 3.3). GRPO's per-sequence mean (`seq_mean`)
gives a token of a short answer more weight than one of a long answer, so long wrong answers are
under-penalised and long right ones under-rewarded, which Dr. GRPO (Liu et al. 2025) shows grows wrong
responses; `seq_sum_norm` is Dr. GRPO's fix (a constant denominator). All three divide by counts of the
whole optimizer step (`Normalizer`), never of a micro-batch, so gradient accumulation over micro-batches
gives the gradient of the full batch.

Tensor shapes: B sequences, T response positions; `mask` (B, T) is 1 on real response tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale: Literal["group_std", "none"] = "group_std",
                     eps: float = 1e-4) -> torch.Tensor:
    """rewards (N,) ordered group by group (N = P * G) -> advantages (N,)."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)  # (P, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group_std":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale != "none":
        raise ValueError(f"scale {scale!r}; allowed: 'group_std', 'none'")
    return centred.view(-1)


def signal_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(groups,) bool, group-major rows: do the group's rewards differ? One whose rewards are all equal has
    advantage 0 everywhere."""
    grouped = rewards.float().view(-1, group_size)
    return grouped.max(dim=1).values != grouped.min(dim=1).values


def zero_signal_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose rewards are all equal: they produce no gradient (DAPO's dynamic-sampling motive)."""
    return float((~signal_groups(rewards, group_size)).float().mean())


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at the target ids: logits (B, T, V), targets (B, T) -> (B, T), fp32."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H(softmax(logits / T)) per position, nats: (B, T, V) -> (B, T), fp32, no graph. The exact entropy over
    the vocabulary, not the sampled-token estimate -log p, which is noisy at one sample per position."""
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    for i in range(logits.shape[0]):  # one row at a time: fp32 copies of a whole (B, T, 151,936) batch are GBs
        row = logits[i].float()
        logp = torch.log_softmax(row if temperature == 1.0 else row / temperature, dim=-1)
        out[i] = -(logp.exp() * logp).sum(-1)
    return out


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased, non-negative estimate of KL(pi_theta || pi_ref) from samples of pi_theta."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def truncated_is_weight(old_logp: torch.Tensor, behavior_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old / pi_behavior, cap), without gradient: corrects rollouts sampled by stale weights."""
    return torch.exp(old_logp - behavior_logp).clamp(max=cap).detach()


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float,
                      clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss (B, T), clipped mask (B, T)); advantages (B,) are broadcast over tokens."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


# ---------------------------------------------------------------------------------------------
# aggregation


@dataclass(frozen=True)
class Normalizer:
    """Counts of the whole optimizer step (all micro-batches), fixed before the first micro-batch."""
    sequences: int
    tokens: int
    max_new_tokens: int


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Normalizer) -> torch.Tensor:
    return (per_token * mask).sum() / max(norm.tokens, 1)


def _seq_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Normalizer) -> torch.Tensor:
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / max(norm.sequences, 1)


def _seq_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, norm: Normalizer) -> torch.Tensor:
    return (per_token * mask).sum() / max(norm.sequences * norm.max_new_tokens, 1)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Normalizer], torch.Tensor]] = {
    "token_mean": _token_mean, "seq_mean": _seq_mean, "seq_sum_norm": _seq_sum_norm}


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, norm: Normalizer) -> torch.Tensor:
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation {how!r}; allowed: {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[how](per_token, mask.to(per_token.dtype), norm)


# ---------------------------------------------------------------------------------------------
# the loss


@dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    aggregation: str = "token_mean"
    is_cap: float | None = None  # None = no IS correction


@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's loss (a graph) and token sums for the step's statistics."""
    loss: torch.Tensor
    tokens: float
    clipped_tokens: float
    kl_sum: float
    is_weight_sum: float
    is_truncated_tokens: float


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              norm: Normalizer, s: LossSettings, behavior_logp: torch.Tensor | None = None,
              ref_logp: torch.Tensor | None = None) -> LossTerms:
    """The micro-batch's share of the step loss; summing `.loss` over micro-batches gives the step loss."""
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, s.clip_low, s.clip_high)
    m = mask.float()
    weight_sum, truncated = float(m.sum()), 0.0
    if s.is_cap is not None and behavior_logp is not None:
        w = truncated_is_weight(old_logp, behavior_logp, s.is_cap)
        per_token = per_token * w
        weight_sum = float((w * m).sum())
        truncated = float(((w >= s.is_cap) * m).sum())
    kl_sum = 0.0
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + s.kl_coef * kl
        kl_sum = float((kl.detach() * m).sum())
    loss = aggregate(per_token, m, s.aggregation, norm)
    return LossTerms(loss, float(m.sum()), float((clipped * m).sum()), kl_sum, weight_sum, truncated)
