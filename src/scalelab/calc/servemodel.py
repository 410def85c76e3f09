"""Time of one prefill and one decode step on a serving instance of `tp` GPUs, from first principles or
from measured rates.

Roofline (Williams et al. 2009) per step: time = max(FLOPs / (tp · peak · eff), bytes / (tp · HBM · eff))
plus tensor-parallel all-reduces (2 per layer, Shoeybi et al. 2019) of the step's tokens x d_model.
Prefill is compute-bound for all but tiny prompts; decode reads every weight once per step and the KV
cache of every running sequence (Pope et al. 2022 "Efficiently Scaling Transformer Inference" sec. 2),
so its time is a + b·B in the batch size B.

`MeasuredRates` (from the serve job, or a JSON file) replaces either model with what was measured:
prefill tokens/s of one instance, and decode step time at a few batch sizes, interpolated linearly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from scalelab.calc.cluster import Cluster
from scalelab.calc.collectives import collective_time_s
from scalelab.calc.flops import decode_flops_per_token, prefill_flops
from scalelab.calc.memory import kv_cache_bytes_per_token
from scalelab.calc.models import ModelSpec, count_params


@dataclass(frozen=True)
class MeasuredRates:
    prefill_tokens_per_s: float | None = None              # one instance, prompt tokens per second
    decode_step_s: tuple[tuple[int, float], ...] = ()      # (batch size, seconds per decode step)
    source: str = ""

    @property
    def empty(self) -> bool:
        return self.prefill_tokens_per_s is None and not self.decode_step_s


def load_measured(path: str | Path) -> MeasuredRates:
    """{"prefill_tokens_per_s": 9000, "decode_step_s": {"1": 0.014, "64": 0.021}, "source": "..."}"""
    data = json.loads(Path(path).read_text())
    steps = tuple(sorted((int(b), float(t)) for b, t in data.get("decode_step_s", {}).items()))
    rate = data.get("prefill_tokens_per_s")
    return MeasuredRates(float(rate) if rate is not None else None, steps, data.get("source", str(path)))


@dataclass(frozen=True)
class ServeSetup:
    model: ModelSpec
    cluster: Cluster                # hardware, TP links, NIC for KV transfer
    tp: int                         # GPUs per instance
    prefill_eff: float = 0.6        # share of bf16 peak prefill matmuls reach
    hbm_eff: float = 0.8            # share of HBM bandwidth decode reaches
    mem_util: float = 0.9           # share of GPU memory the engine may use (vLLM gpu_memory_utilization)
    weight_bytes: float = 2.0       # bf16 weights
    kv_bytes: float = 2.0           # bf16 KV cache
    measured: MeasuredRates = field(default_factory=MeasuredRates)

    # cached: the goodput search evaluates step times ~10^5 times
    @cached_property
    def weights_bytes(self) -> float:
        return count_params(self.model).total * self.weight_bytes

    @cached_property
    def kv_per_token_bytes(self) -> float:
        return kv_cache_bytes_per_token(self.model, self.kv_bytes)

    @cached_property
    def decode_flops_coeffs(self) -> tuple[float, float]:
        """(2N, c): decode FLOPs per token = 2N + c·context (flops.decode_flops_per_token)."""
        base = decode_flops_per_token(self.model, 0)
        return base, decode_flops_per_token(self.model, 1) - base

    @property
    def kv_budget_bytes(self) -> float:
        """Instance memory left for KV cache after weights."""
        return self.tp * self.cluster.hardware.memory_bytes * self.mem_util - self.weights_bytes


def tp_comm_s(ss: ServeSetup, tokens: float) -> float:
    """2 all-reduces per layer of tokens x d_model activations (Shoeybi et al. 2019 sec. 3)."""
    size = tokens * ss.model.d_model * 2.0
    return 2 * ss.model.n_layers * collective_time_s("all_reduce", size, ss.tp, ss.cluster.intra["all_reduce"])


def prefill_time_s(ss: ServeSetup, prompt_tokens: float) -> float:
    if ss.measured.prefill_tokens_per_s:
        return prompt_tokens / ss.measured.prefill_tokens_per_s
    hw = ss.cluster.hardware
    compute = prefill_flops(ss.model, int(round(prompt_tokens))) / (ss.tp * hw.bf16_flops * ss.prefill_eff)
    weights = ss.weights_bytes / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff)
    return max(compute, weights) + tp_comm_s(ss, prompt_tokens)


def decode_step_s(ss: ServeSetup, batch: float, context_tokens: float) -> float:
    """One decode step for `batch` running sequences of mean context `context_tokens`."""
    if ss.measured.decode_step_s:
        return _interpolate(ss.measured.decode_step_s, batch)
    hw = ss.cluster.hardware
    read = ss.weights_bytes + batch * context_tokens * ss.kv_per_token_bytes
    memory = read / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff)
    base, per_ctx = ss.decode_flops_coeffs
    compute = batch * (base + per_ctx * context_tokens) / (ss.tp * hw.bf16_flops * ss.prefill_eff)
    return max(memory, compute) + tp_comm_s(ss, batch)


def _interpolate(points: tuple[tuple[int, float], ...], x: float) -> float:
    """Piecewise-linear through the measured points, extended linearly past both ends."""
    if len(points) == 1:
        return points[0][1]
    pairs = list(zip(points, points[1:]))
    (x0, y0), (x1, y1) = next(((a, b) for a, b in pairs if x <= b[0]), pairs[-1])
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)


def kv_transfer_s(ss: ServeSetup, prompt_tokens: float, link: str) -> float:
    """Prefill -> decode instance: each of the tp GPUs sends its KV shard over its own link
    (Splitwise, Patel et al. 2024; DistServe, Zhong et al. 2024, which places the pair to keep it on NVLink)."""
    nbytes = prompt_tokens * ss.kv_per_token_bytes
    if link == "intra":
        l = ss.cluster.intra["send_recv"]
        return l.latency_s + nbytes / (ss.tp * l.bus_bw_bytes_s)
    return ss.cluster.inter_latency_s + nbytes / (ss.tp * ss.cluster.inter_bw_bytes_s)
