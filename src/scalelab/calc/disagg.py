"""Colocated vs disaggregated prefill/decode for a model, GPU, workload and SLOs: the whole analysis.

Splitwise (Patel et al. 2024) and DistServe (Zhong et al. 2024) split prefill (compute-bound) and
decode (memory-bound) onto separate instances and ship the KV cache between them. This module puts
together goodput.py (per-instance goodput in each role, P:D layouts), crossover.py (when it pays as
prompt length and TPOT SLO move) and the KV-transfer cost, into one `DisaggResult`.
"""
from __future__ import annotations

from dataclasses import dataclass

from scalelab.calc.crossover import (Boundary, Region, ScanPoint, boundaries, prompt_scan, regions,
                                     tpot_scan)
from scalelab.calc.goodput import (AtRate, Capacities, RatioRow, WorkloadStats, capacities, fluid_per_gpu,
                                   gpus_at_rate, ratio_rows, workload_stats)
from scalelab.calc.servemodel import ServeSetup, kv_transfer_s
from scalelab.calc.workload import Workload


@dataclass(frozen=True)
class DisaggResult:
    model: str
    gpu: str
    tp: int
    workload: Workload
    link: str                       # KV transfer link assumed in TTFT: "intra" (NVLink) or "inter" (NIC)
    assumptions: str
    stats: WorkloadStats
    kv_bytes_per_token: float
    kv_transfer_intra_s: float      # mean prompt over NVLink
    kv_transfer_inter_s: float      # mean prompt over the NICs
    capacities: Capacities
    colocated_per_gpu: float
    fluid_per_gpu: float            # disaggregated at the ideal P:D
    ratios: tuple[RatioRow, ...]
    best: RatioRow                  # best P:D with P, D <= 8
    at_rate: AtRate
    prompt_scan: tuple[ScanPoint, ...]
    prompt_regions: tuple[Region, ...]
    prompt_boundaries: tuple[Boundary, ...]
    tpot_scan: tuple[ScanPoint, ...]
    tpot_boundaries: tuple[Boundary, ...]


def analyze(ss: ServeSetup, w: Workload, link: str = "inter", scans: bool = True) -> DisaggResult:
    st = workload_stats(ss, w, link)
    cap = capacities(ss, w, st)
    rows = ratio_rows(cap, ss.tp)
    pscan = prompt_scan(ss, w, link) if scans else []
    tscan = tpot_scan(ss, w, link) if scans else []
    how = (f"measured rates ({ss.measured.source})" if not ss.measured.empty else
           f"roofline: prefill at {ss.prefill_eff:.0%} of bf16 peak, decode at {ss.hbm_eff:.0%} of HBM bandwidth")
    return DisaggResult(
        ss.model.name, ss.cluster.hardware.key, ss.tp, w, link,
        f"{how}; KV cache gets {ss.mem_util:.0%} of memory minus bf16 weights; KV transfer over {link}-node links",
        st, ss.kv_per_token_bytes, kv_transfer_s(ss, st.prompt_mean, "intra"),
        kv_transfer_s(ss, st.prompt_mean, "inter"), cap, cap.colocated_rps / ss.tp, fluid_per_gpu(cap, ss.tp),
        tuple(rows), max(rows, key=lambda r: r.goodput_per_gpu), gpus_at_rate(cap, ss.tp, w.rate_rps),
        tuple(pscan), tuple(regions(pscan)), tuple(boundaries(pscan)), tuple(tscan), tuple(boundaries(tscan)))


def auto_tp(model_bytes: float, memory_bytes: float, share: float = 0.5) -> int:
    """Smallest power-of-two TP whose weight shard uses at most `share` of a GPU, leaving the rest for KV."""
    tp = 1
    while model_bytes / tp > share * memory_bytes and tp < 64:
        tp *= 2
    return tp
