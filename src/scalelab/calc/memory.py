"""Memory per GPU: model states by precision and ZeRO stage, activations per layer, KV cache.

Model states follow ZeRO (Rajbhandari et al. 2020, sec. 3.1 and Fig. 1): with mixed-precision Adam a
parameter costs 2 (16-bit weight) + 2 (16-bit grad) + K = 12 (fp32 master weight, momentum, variance)
bytes; stage 1 shards the K part over the N_d data-parallel ranks, stage 2 also the grads, stage 3
(= FSDP full sharding) also the weights: (2 + 2 + K)·Psi -> 2Psi + 2Psi + K·Psi/N_d -> ... -> (2+2+K)·Psi/N_d.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), sec. 4 and Table 2, for 16-bit activations: per layer s·b·h·(34 + 5·a·s/h) bytes without
parallelism; with tensor parallel t: sbh(10 + 24/t + 5as/(ht)); with sequence parallel as well:
sbh(34/t + 5as/(ht)); selective recompute drops the 5as/h attention-core term; full recompute keeps 2sbh.
The 34 and 10 are rebuilt here from their parts so that GQA, SwiGLU and MoE get their own numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.calc.layout import TrainSetup
from scalelab.calc.models import MLP_KINDS, ModelSpec, attention_shape
from scalelab.calc.parallelism import gpu_params
from scalelab.calc.precision import Precision

# which model-state parts each DP mode shards over the data-parallel group (ZeRO stages 1-3)
SHARDED: dict[str, tuple[bool, bool, bool]] = {     # (optimizer, grads, weights)
    "ddp": (False, False, False), "zero1": (True, False, False),
    "zero2": (True, True, False), "fsdp": (True, True, True),
}


@dataclass(frozen=True)
class StateBytes:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def model_state_bytes(params: float, precision: Precision, dp_mode: str, shard_group: int) -> StateBytes:
    """Bytes per GPU for `params` parameters held by this GPU before ZeRO sharding over `shard_group`."""
    opt, grad, weight = SHARDED[dp_mode]
    n = max(shard_group, 1)
    return StateBytes(weights=params * precision.weight_bytes / (n if weight else 1),
                      grads=params * precision.grad_bytes / (n if grad else 1),
                      optimizer=params * precision.optimizer_bytes / (n if opt else 1))


# ---------------------------------------------------------------------------------------------
# activations (Korthikanti et al. 2022)


@dataclass(frozen=True)
class ActivationCoeffs:
    """bytes per layer = s·b·h·(replicated + split/t) + a·s²·b·core/t, 16-bit activations."""
    replicated: float           # not split by TP (split by SP): norms, block inputs, dropout masks
    split: float                # split by TP: Q/K/V, attention output, MLP hidden
    core: float                 # attention scores: softmax output (2) + dropout mask (1) + its output (2)


def activation_coeffs(m: ModelSpec, moe_layer: bool, dropout: bool) -> ActivationCoeffs:
    a, h = attention_shape(m), m.d_model
    mask = 1.0 if dropout else 0.0
    # sec. 4.1: 2 LayerNorm inputs (4sbh), QKV input (2sbh), MLP input (2sbh), two dropout masks (2sbh)
    replicated = 4.0 + 2.0 + 2.0 + 2.0 * mask
    # Q, K (QK^T inputs), V, output-projection input: 2 bytes x their widths (MHA: 2+2+2+2 = 8sbh)
    attn = 2.0 * (a.q_dim + a.k_dim + a.v_dim + a.o_in_dim) / h
    per_f = MLP_KINDS[m.mlp].act_bytes_per_f
    if moe_layer:   # each token passes top_k routed experts and every shared expert
        mlp = per_f * (m.top_k + m.n_shared_experts) * m.d_ff_expert / h
    else:
        mlp = per_f * m.d_ff / h
    return ActivationCoeffs(replicated, attn + mlp, 2.0 + 3.0 * mask)


def activation_bytes_per_layer(m: ModelSpec, seq: int, micro_batch: int, tp: int = 1, sp: bool = False,
                               recompute: str = "none", dropout: bool = True, moe_layer: bool = False) -> float:
    """Korthikanti et al. 2022 Table 2, per layer (divide the paper's totals by L)."""
    sbh = seq * micro_batch * m.d_model
    if recompute == "full":
        return 2.0 * sbh    # Table 2 last row: only each layer's input is kept
    c = activation_coeffs(m, moe_layer, dropout)
    linear = sbh * (c.replicated / (tp if sp else 1) + c.split / tp)
    core = 0.0 if recompute == "selective" else m.n_heads * seq * seq * micro_batch * c.core / tp
    return linear + core


def inflight_microbatches(pp: int, m: int, vpp: int = 1) -> float:
    """Micro-batches whose activations the first pipeline stage holds at the peak.

    1F1B: p (Narayanan et al. 2021 sec. 2.2.1: at most p in flight). Interleaved with v chunks:
    p·(1 + (p-1)/(p·v)) (Korthikanti et al. 2022 sec. 4.2.3). Never more than m."""
    peak = pp * (1.0 + (pp - 1) / (pp * vpp)) if vpp > 1 else float(pp)
    return min(float(m), peak)


def logits_bytes(m: ModelSpec, seq: int, micro_batch: int, tp: int) -> float:
    """fp32 logits for the loss, 4·s·b·V/t (Korthikanti et al. 2022 sec. 4.3, output layer)."""
    return 4.0 * seq * micro_batch * m.vocab_size / tp


def kv_cache_bytes_per_token(m: ModelSpec, dtype_bytes: float = 2.0) -> float:
    """GQA: 2 (K and V) · L · kv_heads · head_dim · bytes; MLA: L · (kv_lora + rope) · bytes (DeepSeek-V2 Table 1)."""
    return m.n_layers * attention_shape(m).kv_cache_elems * dtype_bytes


# ---------------------------------------------------------------------------------------------
# one GPU of a training setup


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float    # at the 1F1B peak of the first pipeline stage
    other_bytes: float          # fp32 logits, FSDP gathered-unit buffers
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.other_bytes)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


def _activations(s: TrainSetup) -> float:
    lay, b, mdl = s.layout, s.batch, s.model
    seq = b.seq // lay.cp
    kw = dict(tp=lay.tp, sp=lay.sp, recompute=lay.recompute, dropout=s.dropout)
    layers = lay.stage_layers(mdl.n_layers)
    moe = lay.stage_moe_layers(mdl.n_layers, mdl.n_moe_layers)
    dense = layers - moe
    per_mb = (dense * activation_bytes_per_layer(mdl, seq, b.micro_batch, **kw)
              + moe * activation_bytes_per_layer(mdl, seq, b.micro_batch, moe_layer=True, **kw))
    if s.forward_only:      # nothing kept for backward: one layer's working set
        return per_mb / layers
    return per_mb * inflight_microbatches(lay.pp, b.micro_batches(lay), lay.vpp)


def train_memory(s: TrainSetup) -> MemoryBreakdown:
    lay, prec = s.layout, s.precision
    dense, expert = gpu_params(s)
    mode = "ddp" if s.forward_only else lay.dp_mode
    a = model_state_bytes(dense, prec, mode, lay.dp * lay.cp)
    e = model_state_bytes(expert, prec, mode, lay.dp * lay.cp // lay.ep)
    other = logits_bytes(s.model, s.batch.seq // lay.cp, s.batch.micro_batch, lay.tp) if s.with_head else 0.0
    if mode == "fsdp":      # the unit being used and the one prefetched, gathered
        other += 2 * (dense + expert) / lay.stage_layers(s.model.n_layers) * prec.gather_bytes
    grads = 0.0 if s.forward_only else a.grads + e.grads
    opt = 0.0 if s.forward_only else a.optimizer + e.optimizer
    return MemoryBreakdown(a.weights + e.weights, grads, opt, _activations(s), other,
                           s.cluster.hardware.memory_bytes)
