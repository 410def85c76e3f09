"""Will a model fit a serving instance of `tp` GPUs? The pre-check the sweep runs before starting an engine.

An engine at TP=t holds, over its t GPUs (vLLM's accounting: everything it allocates must stay under
gpu_memory_utilization x device memory on every GPU):
  - the bf16 weights, split over the t GPUs (Shoeybi et al. 2019: every matmul is column- or row-split;
    embeddings and the head are vocab-split), so t x (weights / t) = the weights once;
  - a runtime reserve on every GPU: 1 GiB outside PyTorch's allocator (CUDA context, cuBLAS workspaces,
    NCCL buffers; an assumed round number), the activation peak of the engine's profiling forward pass over
    max_num_batched_tokens tokens, and the sampler's fp32 logits and probabilities for max_num_seqs rows;
  - the KV cache (Kwon et al. 2023, PagedAttention): at least `min_kv_tokens` tokens (one longest request),
    at 2 (K, V) x layers x KV heads x head dim x 2 bytes per token. When t exceeds the KV heads, vLLM
    replicates each KV head over t / kv_heads GPUs, so the instance stores that many copies.
vLLM also requires t to divide the attention heads, and the KV heads to be a multiple or a divisor of t.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from scalelab.calc.memory import kv_cache_bytes_per_token
from scalelab.calc.models import ModelSpec, attention_shape, count_params
from scalelab.core.hardware import get_hardware

GIB = 2.0**30
WEIGHT_BYTES = 2.0      # bf16
KV_BYTES = 2.0          # bf16 KV cache (vLLM's default kv_cache_dtype "auto" = the model dtype)
NON_TORCH_RESERVE_BYTES = 1.0 * GIB


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's per-step limits, which set the profiling peak and the chunked-prefill budget."""
    max_num_batched_tokens: int     # tokens per step (decodes + prefill chunk; Agrawal et al. 2024)
    max_num_seqs: int               # running requests per step
    source: str
    mixed_prefill: bool = True      # prompt chunks share the decode step (Sarathi-Serve); False: a prefill runs alone


ENGINE_LIMITS: dict[str, EngineLimits] = {
    "vllm": EngineLimits(8192, 1024, "vLLM V1 defaults for the OpenAI server on GPUs with >= 70 GiB"),
    "sglang": EngineLimits(8192, 1024, "SGLang 0.5.17's chunked_prefill_size on an 80 GB GPU, as its logged "
                                       "server_args show; the 1024-request cap assumed; enable_mixed_chunk=False, "
                                       "its default", mixed_prefill=False),
}


def engine_limits(engine: str) -> EngineLimits:
    if engine not in ENGINE_LIMITS:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(ENGINE_LIMITS)}")
    return ENGINE_LIMITS[engine]


# engine flag -> the limit it sets, per engine (names as in a config's engine.extra_flags)
LIMIT_FLAGS = {"vllm": {"max-num-batched-tokens": "max_num_batched_tokens", "max-num-seqs": "max_num_seqs"},
               "sglang": {"chunked-prefill-size": "max_num_batched_tokens", "max-running-requests": "max_num_seqs"}}


def limits_for(engine: str, flags: Mapping[str, object] | None = None) -> EngineLimits:
    """The engine's limits as its launch flags set them: the per-step token budget and the cap on running
    requests, and for SGLang whether prompt chunks join the decode step (only with --enable-mixed-chunk; by
    default its scheduler runs a prefill step on its own, pausing every running stream)."""
    base = engine_limits(engine)
    flags = {k.replace("_", "-"): v for k, v in (flags or {}).items()}
    set_here = {field: int(flags[flag]) for flag, field in LIMIT_FLAGS.get(engine, {}).items() if flag in flags}
    mixed = base.mixed_prefill or (engine == "sglang" and bool(flags.get("enable-mixed-chunk", False)))
    if not set_here and mixed == base.mixed_prefill:
        return base
    said = [f"{k}={v}" for k, v in set_here.items()] + (["enable-mixed-chunk"] if mixed != base.mixed_prefill else [])
    return replace(base, **set_here, mixed_prefill=mixed, source=f"{base.source}; launch flags: {', '.join(said)}")


@dataclass(frozen=True)
class FitCheck:
    fits: bool
    need_bytes: float               # whole instance
    have_bytes: float               # tp x device memory x mem_util
    reason: str


def weights_bytes(model: ModelSpec) -> float:
    return count_params(model).total * WEIGHT_BYTES


def kv_replicas(model: ModelSpec, tp: int) -> int:
    """Copies of each KV head the instance stores: tp / kv_heads when tp exceeds the KV heads, else 1."""
    kv_heads = model.n_kv_heads if model.attention == "gqa" else 1   # MLA's latent is one shared "head"
    return max(1, tp // kv_heads)


def instance_kv_bytes_per_token(model: ModelSpec, tp: int) -> float:
    return kv_cache_bytes_per_token(model, KV_BYTES) * kv_replicas(model, tp)


def reserve_bytes_per_gpu(model: ModelSpec, tp: int, limits: EngineLimits) -> float:
    """Non-torch memory + one layer's activation peak on the profiling batch + the sampler's buffers."""
    a = attention_shape(model)
    # per token of one layer: residual in and out (2d), QKV (q + 2kv)/t, gate+up (2f/t) and SwiGLU output (f/t)
    width = 2 * model.d_model + (a.q_dim + 2 * a.k_dim) / tp + 3 * model.d_ff / tp
    activation = limits.max_num_batched_tokens * width * 2.0
    sampler = limits.max_num_seqs * model.vocab_size * 4.0 * 2     # fp32 logits + probabilities
    return NON_TORCH_RESERVE_BYTES + activation + sampler


def have_bytes(hardware: str, tp: int, mem_util: float) -> float:
    return tp * get_hardware(hardware).memory_bytes * mem_util


def kv_capacity_tokens(model: ModelSpec, hardware: str, tp: int, mem_util: float,
                       limits: EngineLimits = ENGINE_LIMITS["vllm"]) -> float:
    """KV tokens the instance can hold once weights and reserves are placed (0 if none)."""
    free = have_bytes(hardware, tp, mem_util) - weights_bytes(model) - tp * reserve_bytes_per_gpu(model, tp, limits)
    return max(free, 0.0) / instance_kv_bytes_per_token(model, tp)


def head_split_error(model: ModelSpec, tp: int) -> str:
    """Why vLLM refuses this TP for this model's heads; "" if it accepts it."""
    if tp < 1:
        return f"TP={tp} is not a GPU count"
    if model.n_heads % tp:
        return (f"TP={tp} does not divide its {model.n_heads} attention heads "
                f"(vLLM requires heads % tp == 0)")
    kv = model.n_kv_heads
    if model.attention == "gqa" and kv % tp and tp % kv:
        return (f"TP={tp} neither divides nor is a multiple of its {kv} KV heads "
                f"(vLLM splits or replicates whole KV heads)")
    return ""


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def check_fit(model: ModelSpec, hardware: str, tp: int, mem_util: float, min_kv_tokens: int,
              limits: EngineLimits = ENGINE_LIMITS["vllm"]) -> FitCheck:
    hw = get_hardware(hardware)
    w = weights_bytes(model)
    kv = min_kv_tokens * instance_kv_bytes_per_token(model, tp)
    reserve = tp * reserve_bytes_per_gpu(model, tp, limits)
    need, have = w + kv + reserve, have_bytes(hardware, tp, mem_util)
    budget = f"{tp} x {_gib(hw.memory_bytes)} ({hw.name}) x {mem_util:.2f} = {_gib(have)}"
    split = head_split_error(model, tp)
    if split:
        return FitCheck(False, need, have, f"{model.name}: {split}")
    parts = (f"{_gib(w)} of weights + {_gib(kv)} of KV cache for {min_kv_tokens:,} tokens "
             f"+ {_gib(reserve)} runtime reserve ({_gib(reserve / tp)} per GPU)")
    if need > have:
        return FitCheck(False, need, have, f"{model.name} needs {parts} = {_gib(need)} > {budget}")
    spare = kv_capacity_tokens(model, hardware, tp, mem_util, limits)
    return FitCheck(True, need, have, f"{model.name} fits at TP={tp}: {parts} = {_gib(need)} <= {budget}; "
                                      f"room for {math.floor(spare):,} KV tokens")
