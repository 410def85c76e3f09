"""Communication of each parallelism dimension, per training step and per GPU.

Each builder returns `CommTerm`s: which collective, over how many ranks, how large, how many calls per
step, the bytes this GPU sends, and the time with no overlap. Which compute each term can hide behind
is named in `window` and resolved in plan.py. Sizes follow nccl-tests conventions (collectives.py).

    DP   gradient all-reduce once per step (Li et al. 2020, PyTorch DDP, bucketed);
         ZeRO-1/2: reduce-scatter grads + all-gather params (Rajbhandari et al. 2020 sec. 7.2.1, 2Psi total);
         FSDP/ZeRO-3: all-gather params in forward and again in backward, reduce-scatter grads (3Psi, sec. 7.2.2)
    TP   2 all-reduces of b·s·h per layer forward, 2 backward (Shoeybi et al. 2019 Fig. 3 f/g operators);
         with SP each becomes an all-gather + reduce-scatter of the same size (Korthikanti et al. 2022 sec. 4.2.2)
    PP   activations to the next stage, gradients back, b·s·h/t per micro-batch and virtual stage
         (Narayanan et al. 2021 sec. 4.1 scatter/gather)
    CP   ring attention: each of cp-1 steps passes a K,V block on; backward passes K,V and dK,dV
         (Liu et al. 2023 "Ring Attention", Algorithm 1; Megatron-LM context parallel)
    EP   all-to-all dispatch + combine of top_k copies of each token per MoE layer, twice again in backward
         (Lepikhin et al. 2020, GShard's MoE dispatch/combine; DeepSeek-V3 sec. 3.2.2)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from scalelab.calc.cluster import group_link
from scalelab.calc.collectives import collective_time_s, wire_bytes
from scalelab.calc.layout import TrainSetup
from scalelab.calc.models import attention_shape, count_params


@dataclass(frozen=True)
class CommTerm:
    dim: str                    # DP, TP, PP, CP, EP
    what: str                   # e.g. "gradient all-reduce"
    collective: str             # key of collectives.BUS_FACTOR
    group_size: int
    scope: str                  # "intra" (NVLink) or "inter" (NIC)
    bytes_per_call: float       # nccl-tests size S
    calls_per_step: float
    bytes_per_gpu_step: float   # bytes this GPU sends per step
    time_s: float               # per step, if nothing overlapped
    window: str                 # compute it can hide behind (plan.WINDOWS); "none" = on the critical path
    unhidden_s: float           # part that no overlap can hide (first gather, last bucket)
    link_gb_s: float
    latency_us: float


def _term(s: TrainSetup, dim: str, what: str, collective: str, n: int, size: float, calls: float,
          window: str = "none", unhidden_calls: float = 0.0, group: str = "") -> CommTerm:
    link, scope = group_link(s.cluster, collective, n, s.layout.stride[group or dim])
    one = collective_time_s(collective, size, n, link)
    return CommTerm(dim, what, collective, n, scope, size, calls, calls * wire_bytes(collective, size, n),
                    calls * one, window, min(unhidden_calls, calls) * one, link.bus_bw_bytes_s / 1e9,
                    link.latency_s * 1e6)


def setup_params(s: TrainSetup) -> int:
    """Parameters the setup trains or runs: the whole model, or a bare layer stack without embeddings/head."""
    p = count_params(s.model)
    return p.total if s.with_head else p.total - p.embedding - p.position - p.lm_head


def gpu_params(s: TrainSetup) -> tuple[float, float]:
    """(replicated, expert) parameters on the fullest GPU: TP and PP split everything, EP the routed experts."""
    p, lay = count_params(s.model), s.layout
    dense = p.dense if s.with_head else p.dense - p.embedding - p.position - p.lm_head
    share = lay.stage_imbalance(s.model.n_layers) / (lay.tp * lay.pp)
    return dense * share, p.expert * share / lay.ep


@dataclass(frozen=True)
class DpGroup:
    label: str                  # "" or "expert "
    params: float               # parameters this GPU reduces over the group
    size: int
    stride_key: str             # key of Layout.stride


def _dp_groups(s: TrainSetup) -> list[DpGroup]:
    dense, expert = gpu_params(s)
    lay = s.layout
    # gradients of replicated weights are reduced over DP x CP; of experts over the ranks holding the same experts
    groups = [DpGroup("", dense, lay.dp * lay.cp, "DP"), DpGroup("expert ", expert, lay.dp * lay.cp // lay.ep, "EDP")]
    return [g for g in groups if g.params > 0 and g.size > 1]


def _ddp(s: TrainSetup, g: DpGroup) -> list[CommTerm]:
    total = g.params * s.precision.reduce_bytes
    buckets = max(1, math.ceil(total / (s.layout.ddp_bucket_mib * 2**20)))
    # buckets fire as backward produces grads; the last one waits for the last layer's backward
    return [_term(s, "DP", f"{g.label}gradient all-reduce", "all_reduce", g.size, total / buckets, buckets,
                  "bwd_last", 1, g.stride_key)]


def _zero(s: TrainSetup, g: DpGroup) -> list[CommTerm]:
    # Megatron distributed optimizer: reduce-scatter grads, step on the shard, all-gather updated params
    grads, weights = g.params * s.precision.reduce_bytes, g.params * s.precision.gather_bytes
    buckets = max(1, math.ceil(grads / (s.layout.ddp_bucket_mib * 2**20)))
    return [_term(s, "DP", f"{g.label}gradient reduce-scatter", "reduce_scatter", g.size, grads / buckets, buckets,
                  "bwd_last", 1, g.stride_key),
            _term(s, "DP", f"{g.label}param all-gather", "all_gather", g.size, weights / buckets, buckets,
                  "fwd_first", 1, g.stride_key)]


def _fsdp(s: TrainSetup, g: DpGroup) -> list[CommTerm]:
    # FSDP2 as scalelab pretrain uses it (Zhao et al. 2023): one unit per block plus the root (embeddings,
    # head). Blocks are gathered in forward and again in backward (reshard_after_forward), prefetched one
    # unit ahead, so only the first gather of each pass is exposed; the root is gathered once per
    # micro-batch before anything can overlap it and reduced last. Grad sync (reduce-scatter) runs only on
    # the last micro-batch of an accumulation (set_requires_gradient_sync).
    m, layers = s.batch.micro_batches(s.layout), s.layout.stage_layers(s.model.n_layers)
    p = count_params(s.model)
    with_root = s.with_head and not g.label
    root = (p.embedding + p.position + p.lm_head) / (s.layout.tp * s.layout.pp) if with_root else 0.0
    block = (g.params - root) / layers
    gather, reduce = s.precision.gather_bytes, s.precision.reduce_bytes
    terms = [_term(s, "DP", f"{g.label}FSDP all-gather blocks (fwd)", "all_gather", g.size, block * gather,
                   m * layers, "fwd", m, g.stride_key),
             _term(s, "DP", f"{g.label}FSDP all-gather blocks (bwd)", "all_gather", g.size, block * gather,
                   m * layers, "bwd", m, g.stride_key),
             _term(s, "DP", f"{g.label}FSDP reduce-scatter blocks", "reduce_scatter", g.size, block * reduce,
                   layers, "bwd_last", 0, g.stride_key)]
    if with_root:
        terms += [_term(s, "DP", "FSDP all-gather root", "all_gather", g.size, root * gather, m, "none", 0, "DP"),
                  _term(s, "DP", "FSDP reduce-scatter root", "reduce_scatter", g.size, root * reduce, 1, "none", 0, "DP")]
    return terms


DP_COMM: dict[str, Callable[[TrainSetup, DpGroup], list[CommTerm]]] = {
    "ddp": _ddp, "zero1": _zero, "zero2": _zero, "fsdp": _fsdp}


def dp_terms(s: TrainSetup) -> list[CommTerm]:
    if s.forward_only:
        return []
    return [t for g in _dp_groups(s) for t in DP_COMM[s.layout.dp_mode](s, g)]


def tp_terms(s: TrainSetup) -> list[CommTerm]:
    lay = s.layout
    if lay.tp == 1:
        return []
    m = s.batch.micro_batches(lay)
    size = s.batch.micro_batch * s.batch.seq / lay.cp * s.model.d_model * s.precision.act_bytes
    # per layer: g after attention and after MLP in forward, f before each in backward; full recompute
    # replays the forward's two (Korthikanti et al. 2022 sec. 5)
    per_layer = 2 if s.forward_only else 4 + (2 if lay.recompute == "full" else 0)
    calls = per_layer * lay.stage_layers(s.model.n_layers) * m
    if lay.sp:
        return [_term(s, "TP", "SP all-gather (per layer)", "all_gather", lay.tp, size, calls),
                _term(s, "TP", "SP reduce-scatter (per layer)", "reduce_scatter", lay.tp, size, calls)]
    return [_term(s, "TP", "activation all-reduce (per layer)", "all_reduce", lay.tp, size, calls)]


def pp_terms(s: TrainSetup) -> list[CommTerm]:
    lay = s.layout
    if lay.pp == 1:
        return []
    m = s.batch.micro_batches(lay)
    size = s.batch.micro_batch * s.batch.seq / lay.cp * s.model.d_model * s.precision.act_bytes / lay.tp
    calls = m * lay.vpp * (1 if s.forward_only else 2)      # activations out, their gradients back
    return [_term(s, "PP", "stage activation send", "send_recv", lay.pp, size, calls)]


def cp_terms(s: TrainSetup) -> list[CommTerm]:
    lay = s.layout
    if lay.cp == 1:
        return []
    m = s.batch.micro_batches(lay)
    tokens = s.batch.micro_batch * s.batch.seq / lay.cp
    block = tokens * attention_shape(s.model).kv_exchange_elems / lay.tp * s.precision.act_bytes
    per_layer = (lay.cp - 1) * (1 if s.forward_only else 3)   # forward: K,V; backward: K,V and dK,dV
    calls = per_layer * lay.stage_layers(s.model.n_layers) * m
    # ring attention overlaps each block transfer with the attention on the previous block (Liu et al. sec. 3)
    return [_term(s, "CP", "ring-attention K/V exchange", "send_recv", lay.cp, block, calls, "attn")]


def ep_terms(s: TrainSetup) -> list[CommTerm]:
    lay = s.layout
    if lay.ep == 1 or not s.model.is_moe:
        return []
    m = s.batch.micro_batches(lay)
    tokens = s.batch.micro_batch * s.batch.seq / (lay.cp * lay.tp)     # TP ranks split tokens (SP)
    size = tokens * s.model.top_k * s.model.d_model * s.precision.act_bytes
    moe_layers = lay.stage_moe_layers(s.model.n_layers, s.model.n_moe_layers)
    calls = (2 if s.forward_only else 4) * moe_layers * m
    window = "all" if lay.ep_overlap else "none"
    return [_term(s, "EP", "all-to-all dispatch + combine", "all_to_all", lay.ep, size, calls, window)]


DIMENSIONS: dict[str, Callable[[TrainSetup], list[CommTerm]]] = {
    "DP": dp_terms, "TP": tp_terms, "PP": pp_terms, "CP": cp_terms, "EP": ep_terms}


def all_terms(s: TrainSetup) -> list[CommTerm]:
    return [t for build in DIMENSIONS.values() for t in build(s)]


def bubble_fraction(pp: int, m: int, vpp: int = 1) -> float:
    """Idle share of a pipelined step: (p-1)/(v·m + p - 1).

    Narayanan et al. 2021 sec. 2.2: bubble time / ideal time = (p-1)/m for 1F1B and (p-1)/(v·m) with v
    interleaved chunks; as a share of the whole step that is (p-1)/(m+p-1) and (p-1)/(v·m+p-1)."""
    return (pp - 1) / (vpp * m + pp - 1)
