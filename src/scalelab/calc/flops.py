"""FLOPs per token for training and inference (multiply-add = 2 FLOPs).

Conventions, stated once:
- N is `ParamCount.flops_params`: every matmul weight a token passes through, i.e. the non-embedding
  parameters plus the output projection (Kaplan et al. 2020, Table 1), with only the top-k routed
  experts of a MoE layer.
- Training = forward + backward = 3 x forward (backward computes grads of inputs and of weights,
  each as large as the forward; Kaplan et al. 2020 sec. 2.1), so C_train = 6N + attention.
- Training attention counts QK^T and AV over the full T x T square, as PaLM's MFU does (Chowdhery et
  al. 2022, Appendix B: 6N + 12·L·H·Q·T with H·Q = d for MHA); causal masking is not subtracted, so
  MFU numbers compare with published ones.
- Inference attention counts only the causal triangle, the work FlashAttention actually does, because
  there we predict a time, not a utilisation.
"""
from __future__ import annotations

from scalelab.calc.models import ModelSpec, attention_shape, count_params


def attention_flops_per_context_token(m: ModelSpec) -> float:
    """Forward FLOPs one query token spends per key it attends to, over all layers:
    2·L·h·(d_qk + d_v) (QK^T: 2·h·d_qk, AV: 2·h·d_v per key; PaLM App. B). Equals 4·L·d for MHA."""
    a = attention_shape(m)
    return 2.0 * m.n_layers * m.n_heads * (a.qk_head_dim + a.v_head_dim)


def forward_flops_per_token(m: ModelSpec, seq: int, with_head: bool = True) -> float:
    """2N + 2·L·h·(d_qk+d_v)·T: one token's forward in a length-T training sequence (PaLM App. B / 3)."""
    n = count_params(m).flops_params
    if not with_head:
        n -= m.vocab_size * m.d_model
    return 2.0 * n + attention_flops_per_context_token(m) * seq


def train_flops_per_token(m: ModelSpec, seq: int, with_head: bool = True) -> float:
    """6N + 12·L·d·T for MHA (PaLM App. B; Hoffmann et al. 2022 App. F): model FLOPs, the MFU numerator."""
    return 3.0 * forward_flops_per_token(m, seq, with_head)


def prefill_flops(m: ModelSpec, prompt_tokens: int) -> float:
    """Forward over a P-token prompt with a causal mask: 2N·P + c·P(P+1)/2, c per (query, key) pair."""
    n = count_params(m).flops_params
    p = prompt_tokens
    return 2.0 * n * p + attention_flops_per_context_token(m) * p * (p + 1) / 2.0


def decode_flops_per_token(m: ModelSpec, context_tokens: int) -> float:
    """One generated token attending to `context_tokens` cached keys: 2N + c·context."""
    return 2.0 * count_params(m).flops_params + attention_flops_per_context_token(m) * context_tokens
