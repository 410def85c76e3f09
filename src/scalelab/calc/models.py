"""Transformer architecture records, exact parameter counts, and the preset table.

A `ModelSpec` holds the published shape of a decoder-only transformer; `count_params` turns it into
a `ParamCount` broken down by part (embeddings, attention, dense MLP, routed/shared experts, router,
norms, output head). Attention and MLP variants are registries (`ATTENTION_KINDS`, `MLP_KINDS`), not
if/elif chains: GQA covers MHA (kv heads = heads) and MQA; MLA is DeepSeek-V2/V3's latent attention.

The presets are the configs published with each model (config.json on the Hugging Face hub); the
tests check the totals against the published parameter counts and against transformers' own modules.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int                       # hidden width of a dense MLP block
    vocab_size: int                 # rows of the embedding table (padded vocab if the trainer pads)
    mlp: str = "swiglu"             # key of MLP_KINDS
    attention: str = "gqa"          # key of ATTENTION_KINDS
    d_head: int = 0                 # 0 = d_model // n_heads
    tied_embeddings: bool = False   # output head shares the input embedding matrix (GPT-2)
    learned_pos_len: int = 0        # rows of a learned position table (GPT-2: 1024); 0 = RoPE, no table
    bias: str = "none"              # "none", "all" (GPT-2: every Linear and LayerNorm), "qkv" (Qwen2)
    norm: str = "rmsnorm"           # "rmsnorm" (weight) or "layernorm" (weight + bias)
    # mixture of experts (n_experts = 0: dense)
    n_experts: int = 0              # routed experts per MoE layer
    n_shared_experts: int = 0       # always-on experts per MoE layer (DeepSeekMoE, Dai et al. 2024)
    top_k: int = 0                  # routed experts per token
    d_ff_expert: int = 0            # hidden width of one expert
    n_dense_layers: int = 0         # leading layers with a dense MLP (DeepSeek-V3: 3)
    # multi-head latent attention (DeepSeek-V2 sec. 2.1, Liu et al. 2024)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    def with_layers(self, n_layers: int) -> "ModelSpec":
        """The same architecture with another depth (a layer stack for a benchmark)."""
        dense = min(self.n_dense_layers, n_layers)
        return dataclasses.replace(self, name=f"{self.name}[{n_layers}L]", n_layers=n_layers, n_dense_layers=dense)


# ---------------------------------------------------------------------------------------------
# attention variants


@dataclass(frozen=True)
class AttentionShape:
    params: int                 # weights + biases of one attention block
    q_dim: int                  # per-token width of Q over all heads
    k_dim: int                  # per-token width of K (GQA: kv heads x head dim)
    v_dim: int                  # per-token width of V over all heads; also the output projection's input
    o_in_dim: int               # input width of the output projection
    qk_head_dim: int            # per-head width of the QK^T product
    v_head_dim: int             # per-head width of the AV product
    kv_cache_elems: int         # elements cached per token per layer at inference
    kv_exchange_elems: int      # K+V elements per token a ring-attention step passes on (Liu et al. 2023)


def _gqa(m: ModelSpec) -> AttentionShape:
    # Ainslie et al. 2023 (GQA): n_kv_heads K/V heads shared by groups of query heads.
    hd, d = m.head_dim, m.d_model
    q, kv = m.n_heads * hd, m.n_kv_heads * hd
    weights = d * (q + 2 * kv) + q * d
    biases = {"none": 0, "qkv": q + 2 * kv, "all": q + 2 * kv + d}[m.bias]
    return AttentionShape(weights + biases, q, kv, kv, q, hd, hd, 2 * kv, 2 * kv)


def _mla(m: ModelSpec) -> AttentionShape:
    # DeepSeek-V2 sec. 2.1 and App. C: queries through a rank-q_lora bottleneck, keys/values through a
    # rank-kv_lora latent c_KV plus a shared RoPE key k_R; only [c_KV, k_R] is cached ((d_c + d_R)·l, Table 1).
    d, h = m.d_model, m.n_heads
    qk = m.qk_nope_dim + m.qk_rope_dim
    q_proj = d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk if m.q_lora_rank else d * h * qk
    kv_proj = d * (m.kv_lora_rank + m.qk_rope_dim) + m.kv_lora_rank + m.kv_lora_rank * h * (m.qk_nope_dim + m.v_head_dim)
    o_proj = h * m.v_head_dim * d
    return AttentionShape(q_proj + kv_proj + o_proj, h * qk, h * qk, h * m.v_head_dim, h * m.v_head_dim,
                          qk, m.v_head_dim, m.kv_lora_rank + m.qk_rope_dim, h * qk + h * m.v_head_dim)


ATTENTION_KINDS: dict[str, Callable[[ModelSpec], AttentionShape]] = {"gqa": _gqa, "mla": _mla}


def attention_shape(m: ModelSpec) -> AttentionShape:
    if m.attention not in ATTENTION_KINDS:
        raise KeyError(f"{m.name}: unknown attention {m.attention!r}; known: {', '.join(ATTENTION_KINDS)}")
    return ATTENTION_KINDS[m.attention](m)


# ---------------------------------------------------------------------------------------------
# MLP variants: parameters of one block of hidden width f, and the activation bytes it stores


@dataclass(frozen=True)
class MlpKind:
    n_matrices: int             # d x f weight matrices (GELU: up, down; SwiGLU: gate, up, down; Shazeer 2020)
    act_bytes_per_f: float      # bytes stored per token per unit of f for backward, 16-bit activations


MLP_KINDS: dict[str, MlpKind] = {
    # Korthikanti et al. 2022 sec. 4.1: GELU input (2f bytes) + second linear's input (2f) = 4f; f=4h gives 16sbh
    "gelu": MlpKind(2, 4.0),
    # SwiGLU keeps the gate and up outputs (2f each) and their product, the down projection's input (2f)
    "swiglu": MlpKind(3, 6.0),
}


def mlp_params(m: ModelSpec, f: int) -> int:
    kind = MLP_KINDS[m.mlp]
    biases = (kind.n_matrices - 1) * f + m.d_model if m.bias == "all" else 0
    return kind.n_matrices * m.d_model * f + biases


def norm_params(m: ModelSpec) -> int:
    return {"rmsnorm": m.d_model, "layernorm": 2 * m.d_model}[m.norm]


# ---------------------------------------------------------------------------------------------
# parameter counts


@dataclass(frozen=True)
class ParamCount:
    embedding: int              # input token table V x d
    position: int               # learned position table (GPT-2), 0 with RoPE
    attention: int              # all layers
    dense_mlp: int              # all dense-MLP layers
    routed_experts: int         # all MoE layers, all routed experts
    shared_experts: int
    router: int
    norms: int                  # per-layer norms + the final norm
    lm_head: int                # 0 when tied to the embedding
    vocab_size: int
    d_model: int
    top_k: int
    n_experts: int

    @property
    def total(self) -> int:
        return (self.embedding + self.position + self.attention + self.dense_mlp + self.routed_experts
                + self.shared_experts + self.router + self.norms + self.lm_head)

    @property
    def expert(self) -> int:
        """Parameters that expert parallelism shards (routed experts only)."""
        return self.routed_experts

    @property
    def dense(self) -> int:
        """Everything replicated across expert-parallel ranks."""
        return self.total - self.routed_experts

    @property
    def active_routed(self) -> float:
        return self.routed_experts * self.top_k / self.n_experts if self.n_experts else 0.0

    @property
    def active(self) -> float:
        """Parameters one token touches (DeepSeek-V3's "37B activated")."""
        return self.total - self.routed_experts + self.active_routed

    @property
    def flops_params(self) -> float:
        """N in C = 2N per token forward: every matmul weight a token passes through (Kaplan et al. 2020
        Table 1: non-embedding parameters plus the de-embedding 2·d·V, which a tied head reuses)."""
        matmul = self.attention + self.dense_mlp + self.shared_experts + self.router + self.active_routed
        return matmul + self.vocab_size * self.d_model


def count_params(m: ModelSpec) -> ParamCount:
    n_dense = m.n_layers - m.n_moe_layers
    routed = m.n_moe_layers * m.n_experts * mlp_params(m, m.d_ff_expert)
    shared = m.n_moe_layers * m.n_shared_experts * mlp_params(m, m.d_ff_expert)
    return ParamCount(
        embedding=m.vocab_size * m.d_model,
        position=m.learned_pos_len * m.d_model,
        attention=m.n_layers * attention_shape(m).params,
        dense_mlp=n_dense * mlp_params(m, m.d_ff),
        routed_experts=routed,
        shared_experts=shared,
        router=m.n_moe_layers * m.n_experts * m.d_model,
        norms=(2 * m.n_layers + 1) * norm_params(m),
        lm_head=0 if m.tied_embeddings else m.vocab_size * m.d_model,
        vocab_size=m.vocab_size, d_model=m.d_model, top_k=m.top_k, n_experts=m.n_experts)

