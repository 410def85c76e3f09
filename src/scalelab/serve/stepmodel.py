"""One engine step of a serving instance, and the constants of the serving model (ServeCalibration).

A step with d decoding sequences of mean context c and a prefill of p tokens (attending to a prior context of
s tokens) takes, on the roofline of Pope et al. 2022 sec. 2 (calc.servemodel):
    t = max(FLOPs / (tp·peak·prefill_eff), bytes / (tp·HBM·hbm_eff)) + all-reduces + overhead(tp)
    FLOPs = d·(2N + a·c) + 2N·p + a·(p·s + p(p+1)/2)      bytes = weights + d·c·kv_bytes_per_token
    all-reduces = 2 per layer of (d + p) x d_model bf16 (Shoeybi et al. 2019), alpha-beta (calc.collectives)
    overhead(tp) = overhead_tp1 + sync_per_extra_rank·(tp - 1): scheduler, sampler, launches, worker sync.
A request also pays `request_overhead_s` once, outside the engine's steps (serve.simulate, serve.steady).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from scalelab.calc.cluster import Cluster, make_cluster
from scalelab.calc.collectives import Link
from scalelab.calc.flops import attention_flops_per_context_token, decode_flops_per_token
from scalelab.calc.models import ModelSpec
from scalelab.calc.servemodel import ServeSetup, tp_comm_s
from scalelab.core.hardware import get_hardware
from scalelab.serve.fit import KV_BYTES, kv_replicas

# vLLM and SGLang all-reduce small activations with their own one-shot kernel over NVLink peer memory (vLLM PR
# #2192), captured in the decode step's CUDA graph: sglang PR #2904 measured vLLM's at 8.7-9.5 us for 512 B-32 KB
# at TP=2/4/8 on H100 without CUDA graphs, so no more than that under graphs. The eager NCCL alpha of the
# hardware table (fitted to bench/nccl_bench.py's eager collectives) is host launch time that graphs remove.
CUSTOM_ALLREDUCE_LATENCY_S = 9e-6
NVLINK_MIN_GB_S = 100.0     # links at least this fast are NVLink (PCIe 4/5 x16 is 32/64 GB/s): custom all-reduce
# Per request, once, outside the engine's steps: the OpenAI server's HTTP parsing and tokenization, the hand-off
# to the engine-core process over ZMQ, and the first token's way back (detokenization, its SSE chunk). The vLLM
# OpenAI server adds ~4 ms of TTFT over the same engine called in-process (tenstorrent/tt-inference-server issue
# #190: "+4 ms, acceptable from HTTP server + ZMQ latency").
REQUEST_OVERHEAD_S = 0.004

PRIOR_SOURCE = (
    "priors: hbm_eff 0.8 and prefill_eff 0.6 as in calc.servemodel.ServeSetup; step overhead 2.0 ms at TP=1 "
    "(assumed: scheduler + sampler + kernel launches under CUDA graphs) + 0.5 ms per extra rank (assumed: "
    "broadcasting each step's schedule to the TP worker processes and their sync); all-reduce latency 9 us on "
    "NVLink (the engines' one-shot custom all-reduce: vLLM PR #2192, 8.7-9.5 us measured in sglang PR #2904), "
    "else the cluster link's alpha; 4 ms per request outside the steps (HTTP, tokenization, ZMQ hand-off and the "
    "first token's return: +4 ms TTFT of vLLM's server over in-process calls, tt-inference-server issue #190)")


@dataclass(frozen=True)
class ServeCalibration:
    hbm_eff: float = 0.8                    # share of HBM bandwidth a decode step reaches
    prefill_eff: float = 0.6                # share of bf16 peak the step's matmuls reach
    overhead_tp1_s: float = 0.002           # fixed cost of one engine step at TP=1
    sync_per_extra_rank_s: float = 0.0005   # added per extra TP rank
    allreduce_latency_s: float | None = None    # per call; None = custom all-reduce on NVLink, else the link alpha
    request_overhead_s: float = REQUEST_OVERHEAD_S  # per request, added to its TTFT and to the closed loop's gap
    fitted_on: tuple[str, ...] = ()         # RowKey labels the constants were fitted on; () = priors only
    fitted_params: tuple[str, ...] = ()     # the constants the fit moved; the others are priors
    fit_rel_err: tuple[tuple[str, float], ...] = ()   # (figure, max |pred/meas - 1| over the fitted rows)
    prior_band: float = 0.2                 # +-share on both efficiencies for the priors' interval
    overhead_band: float = 0.5              # +-share on overheads and all-reduce latency for the priors' interval
    source: str = PRIOR_SOURCE

    def step_overhead_s(self, tp: int) -> float:
        return self.overhead_tp1_s + self.sync_per_extra_rank_s * (tp - 1)

    @property
    def fitted(self) -> bool:
        return bool(self.fitted_on)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fitted_on": list(self.fitted_on),
                "fitted_params": list(self.fitted_params), "fit_rel_err": dict(self.fit_rel_err)}


def calibration_from_dict(d: dict[str, Any]) -> ServeCalibration:
    """A recorded calibration; one written before request_overhead_s existed had none (0)."""
    names = {f.name for f in dataclasses.fields(ServeCalibration)}
    known = {k: v for k, v in d.items() if k in names}
    return ServeCalibration(**{"request_overhead_s": 0.0, **known, "fitted_on": tuple(d.get("fitted_on", ())),
                               "fitted_params": tuple(d.get("fitted_params", ())),
                               "fit_rel_err": tuple(dict(d.get("fit_rel_err", {})).items())})


@lru_cache(maxsize=64)
def _cluster(hardware: str, tp: int) -> Cluster:
    return make_cluster(hardware, tp)


def _with_latency(cluster: Cluster, latency_s: float | None) -> Cluster:
    """The cluster with every intra-node collective's alpha replaced (as make_cluster's latency override)."""
    if latency_s is None:
        return cluster
    links = {c: Link(l.bus_bw_bytes_s, latency_s, f"{l.source}; alpha {latency_s * 1e6:.1f} us from the calibration")
             for c, l in cluster.intra.items()}
    return dataclasses.replace(cluster, intra=links, calibrated=False)


@lru_cache(maxsize=256)
def _setup(model: ModelSpec, hardware: str, tp: int, hbm_eff: float, prefill_eff: float, mem_util: float,
           allreduce_latency_s: float | None) -> ServeSetup:
    cluster = _with_latency(_cluster(hardware, tp), allreduce_latency_s)
    # kv_bytes counts every replica of a KV head the instance stores (fit.kv_replicas)
    return ServeSetup(model, cluster, tp, prefill_eff=prefill_eff, hbm_eff=hbm_eff, mem_util=mem_util,
                      kv_bytes=KV_BYTES * kv_replicas(model, tp))


@dataclass(frozen=True)
class StepTerms:
    compute_s: Any
    memory_s: Any
    weights_s: Any              # the weights' share of memory_s
    comm_s: Any
    overhead_s: float

    @property
    def total_s(self) -> Any:
        return np.maximum(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s


@dataclass(frozen=True)
class StepModel:
    setup: ServeSetup
    overhead_s: float
    two_n: float                # 2N: FLOPs per token through the weights
    attn_flops: float           # a: FLOPs per (query, key) pair over all layers
    flops_per_s: float          # tp x peak x prefill_eff
    bytes_per_s: float          # tp x HBM x hbm_eff
    comm_fixed_s: float         # tp_comm_s is linear in the step's tokens: fixed + per_token x tokens
    comm_per_token_s: float

    def scalar_step_s(self, decodes: int, ctx_sum: float, prefill_tokens: float, prefill_pairs: float) -> float:
        """terms(...).total_s for one step, in plain floats (the schedule simulation calls it once per step);
        ctx_sum = the decoding sequences' contexts added up."""
        flops = decodes * self.two_n + self.attn_flops * (ctx_sum + prefill_pairs) + self.two_n * prefill_tokens
        read = self.setup.weights_bytes + ctx_sum * self.setup.kv_per_token_bytes
        comm = self.comm_fixed_s + self.comm_per_token_s * (decodes + prefill_tokens)
        return max(flops / self.flops_per_s, read / self.bytes_per_s) + comm + self.overhead_s

    def decode_run_s(self, decodes: int, ctx_sum: float, n: int) -> np.ndarray:
        """n consecutive decode-only steps of `decodes` sequences whose contexts grow by one token per step."""
        ctx = ctx_sum + decodes * np.arange(n)
        flops = decodes * self.two_n + self.attn_flops * ctx
        read = self.setup.weights_bytes + ctx * self.setup.kv_per_token_bytes
        comm = self.comm_fixed_s + self.comm_per_token_s * decodes
        return np.maximum(flops / self.flops_per_s, read / self.bytes_per_s) + comm + self.overhead_s

    def terms(self, decodes: Any, ctx: float, prefill_tokens: Any = 0.0, prefill_pairs: Any = 0.0) -> StepTerms:
        """Roofline terms of one step (arrays broadcast); calc.servemodel.decode_step_s and prefill_time_s
        are its two pure cases."""
        ss, hw = self.setup, self.setup.cluster.hardware
        flops = decodes * (self.two_n + self.attn_flops * ctx) + self.two_n * prefill_tokens \
            + self.attn_flops * prefill_pairs
        read = ss.weights_bytes + decodes * ctx * ss.kv_per_token_bytes
        return StepTerms(compute_s=flops / (ss.tp * hw.bf16_flops * ss.prefill_eff),
                         memory_s=read / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff),
                         weights_s=ss.weights_bytes / (ss.tp * hw.hbm_bytes_s * ss.hbm_eff),
                         comm_s=tp_comm_s(ss, decodes + prefill_tokens), overhead_s=self.overhead_s)

    def step_s(self, decodes: Any, ctx: float, prefill_tokens: Any = 0.0, prefill_pairs: Any = 0.0) -> Any:
        return self.terms(decodes, ctx, prefill_tokens, prefill_pairs).total_s


def step_model(model: ModelSpec, hardware: str, tp: int, mem_util: float, cal: ServeCalibration) -> StepModel:
    lat = allreduce_latency_s(model, hardware, tp, cal) if tp > 1 else None
    ss = _setup(model, hardware, tp, cal.hbm_eff, cal.prefill_eff, mem_util, lat)
    hw = ss.cluster.hardware
    fixed = float(tp_comm_s(ss, 0.0))
    return StepModel(ss, cal.step_overhead_s(tp), decode_flops_per_token(model, 0),
                     attention_flops_per_context_token(model), tp * hw.bf16_flops * cal.prefill_eff,
                     tp * hw.hbm_bytes_s * cal.hbm_eff, fixed, float(tp_comm_s(ss, 1.0)) - fixed)


def allreduce_latency_s(model: ModelSpec, hardware: str, tp: int, cal: ServeCalibration) -> float:
    """The per-call all-reduce latency in use: the calibration's, else the engines' custom all-reduce on NVLink,
    else the cluster link's alpha."""
    if cal.allreduce_latency_s is not None:
        return cal.allreduce_latency_s
    if get_hardware(hardware).link_gb_s >= NVLINK_MIN_GB_S:
        return CUSTOM_ALLREDUCE_LATENCY_S
    return _cluster(hardware, max(tp, 2)).intra["all_reduce"].latency_s


def resolved(cal: ServeCalibration, model: ModelSpec, hardware: str, tp: int) -> ServeCalibration:
    """The calibration with the all-reduce latency it implies written out."""
    return dataclasses.replace(cal, allreduce_latency_s=allreduce_latency_s(model, hardware, tp, cal))
