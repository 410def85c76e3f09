"""A training (or forward-only) step estimate: compute, communication after overlap, bubble, memory, MFU.

Time model of one step on one GPU (the first pipeline stage, which holds the most activations):

    compute  = FLOPs per token (incl. recomputation) x tokens per step / (GPUs x peak x efficiency)
    stage    = compute + exposed TP/CP/EP comm       (they sit inside each micro-batch's stage time)
    bubble   = (p-1)/v x stage / m                   (Narayanan et al. 2021 sec. 2.2)
    step     = stage + bubble + exposed PP sends + exposed DP comm

Overlap assumptions (the `window` of each CommTerm): DP gradient buckets hide behind the last
micro-batch's backward, except the last bucket (PyTorch DDP, Li et al. 2020 sec. 3.2.3); FSDP gathers
are prefetched behind forward/backward compute except the first of each pass; ZeRO param all-gathers
hide behind the next forward; ring-attention transfers hide behind attention compute (Liu et al. 2023);
TP collectives, PP sends and EP all-to-alls are on the critical path (Megatron-LM defaults) unless
`ep_overlap` (DeepSeek-V3 DualPipe). Terms sharing a window are hidden jointly; distinct windows are
treated as independent, and compute slowed by concurrent communication is not modelled.

MFU (Chowdhery et al. 2022, App. B) = model FLOPs per token x tokens / (step x GPUs x peak); recomputed
FLOPs do not count. The MFU bound is the same step with compute at 100% of peak: what communication and
the bubble alone leave.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from scalelab.calc.flops import attention_flops_per_context_token, forward_flops_per_token
from scalelab.calc.layout import TrainSetup
from scalelab.calc.memory import MemoryBreakdown, train_memory
from scalelab.calc.parallelism import CommTerm, all_terms, bubble_fraction
from scalelab.core.numfmt import nbytes, pct, seconds


@dataclass(frozen=True)
class ComputeTimes:
    model_flops_per_token: float    # MFU numerator: 6N + attention (train) or 2N + attention (forward)
    hw_flops_per_token: float       # what runs, incl. full-recompute forward replays
    total_s: float                  # per step per GPU, no bubble
    fwd_s: float
    bwd_s: float
    attn_s: float                   # attention-core share of total_s


def compute_times(s: TrainSetup, eff: float) -> ComputeTimes:
    fwd = forward_flops_per_token(s.model, s.batch.seq, s.with_head)
    passes = 1.0 if s.forward_only else 3.0        # backward = 2 x forward (Kaplan et al. 2020 sec. 2.1)
    replay = 1.0 if (s.layout.recompute == "full" and not s.forward_only) else 0.0
    hw = fwd * (passes + replay)
    peak = s.cluster.hardware.bf16_flops * eff
    # the fullest pipeline stage sets the pace when p·v does not divide the layers
    total = hw * s.batch.tokens_per_step / (s.layout.world * peak) * s.layout.stage_imbalance(s.model.n_layers)
    fwd_s = total / (passes + replay)
    attn_share = attention_flops_per_context_token(s.model) * s.batch.seq / fwd
    return ComputeTimes(fwd * passes, hw, total, fwd_s, total - fwd_s, total * attn_share)


# seconds of compute each window offers; m = micro-batches per step
WINDOWS: dict[str, Callable[[ComputeTimes, int], float]] = {
    "none": lambda c, m: 0.0,
    "fwd": lambda c, m: c.fwd_s,
    "bwd": lambda c, m: c.bwd_s,
    "fwd_first": lambda c, m: c.fwd_s / m,
    "bwd_last": lambda c, m: c.bwd_s / m,
    "attn": lambda c, m: c.attn_s,
    "all": lambda c, m: c.total_s,
}

WHY: dict[str, str] = {
    "none": "it is on the critical path (no overlap assumed)",
    "fwd": "forward compute hides all but the first gather of each micro-batch",
    "bwd": "backward compute hides all but the first gather of each micro-batch",
    "fwd_first": "only the next step's first forward can hide it",
    "bwd_last": "only the last micro-batch's backward can hide it, and the last bucket not at all",
    "attn": "only the attention compute can hide it",
    "all": "it overlaps with all compute (DualPipe-style)",
}


def exposed_times(terms: list[CommTerm], c: ComputeTimes, m: int) -> list[float]:
    """Per term, the seconds not hidden: per window, unhidden + max(0, rest - window), shared pro rata."""
    out = [0.0] * len(terms)
    for window in {t.window for t in terms}:
        idx = [i for i, t in enumerate(terms) if t.window == window]
        total = sum(terms[i].time_s for i in idx)
        floor = sum(terms[i].unhidden_s for i in idx)
        exposed = floor + max(0.0, total - floor - WINDOWS[window](c, m))
        for i in idx:
            out[i] = exposed * terms[i].time_s / total if total else 0.0
    return out


@dataclass(frozen=True)
class TermEstimate:
    term: CommTerm
    exposed_s: float
    bytes_per_token: float          # bytes the whole cluster sends per trained token


@dataclass(frozen=True)
class StepEstimate:
    setup: TrainSetup
    compute_eff: float
    micro_batches: int
    tokens_per_step: int
    compute: ComputeTimes
    terms: tuple[TermEstimate, ...]
    bubble_fraction: float
    bubble_s: float
    step_s: float
    comm_s: float                   # all communication, before overlap
    exposed_comm_s: float
    tokens_per_s: float
    mfu: float
    mfu_bound: float
    memory: MemoryBreakdown
    dominant: str

    def dim_totals(self) -> dict[str, tuple[float, float, float, float]]:
        """dim -> (time_s, exposed_s, bytes per GPU per step, bytes per token)."""
        out: dict[str, tuple[float, float, float, float]] = {}
        for e in self.terms:
            t, x, b, bt = out.get(e.term.dim, (0.0, 0.0, 0.0, 0.0))
            out[e.term.dim] = (t + e.term.time_s, x + e.exposed_s, b + e.term.bytes_per_gpu_step, bt + e.bytes_per_token)
        return out


STAGE_DIMS = ("TP", "CP", "EP")     # inside a stage's micro-batch, so the bubble stretches with them


def _estimate(s: TrainSetup, eff: float) -> StepEstimate:
    lay, m = s.layout, s.batch.micro_batches(s.layout)
    c = compute_times(s, eff)
    terms = all_terms(s)
    exposed = exposed_times(terms, c, m)
    tokens = s.batch.tokens_per_step
    est = tuple(TermEstimate(t, x, t.bytes_per_gpu_step * lay.world / tokens) for t, x in zip(terms, exposed))
    stage = c.total_s + sum(e.exposed_s for e in est if e.term.dim in STAGE_DIMS)
    bubble = (lay.pp - 1) / lay.vpp * stage / m
    rest = sum(e.exposed_s for e in est if e.term.dim not in STAGE_DIMS)
    step = stage + bubble + rest
    mfu = c.model_flops_per_token * tokens / (step * lay.world * s.cluster.hardware.bf16_flops)
    return StepEstimate(s, eff, m, tokens, c, est, bubble_fraction(lay.pp, m, lay.vpp), bubble, step,
                        sum(t.time_s for t in terms), sum(exposed), tokens / step, mfu, mfu,
                        train_memory(s), "")


def estimate_step(s: TrainSetup, compute_eff: float = 0.5) -> StepEstimate:
    """The step at `compute_eff` of peak for the matmuls, and the MFU bound at 100%."""
    s.check()
    est = _estimate(s, compute_eff)
    bound = _estimate(s, 1.0)
    return dataclasses.replace(est, mfu_bound=bound.mfu, dominant=dominant_sentence(est))


def dominant_sentence(e: StepEstimate) -> str:
    """Which term of the step is largest, and why, in one sentence."""
    parts = {"compute": e.compute.total_s, "pipeline bubble": e.bubble_s}
    parts.update({f"{d} communication": x for d, (_, x, _, _) in e.dim_totals().items()})
    overheads = {k: v for k, v in parts.items() if k != "compute" and v > 0}
    if not overheads:
        return (f"Compute is the whole step ({seconds(e.step_s)}): no communication or bubble is exposed, "
                f"so MFU equals the assumed matmul efficiency ({pct(e.compute_eff)}).")
    name = max(overheads, key=overheads.get)
    why = _why(e, name)
    if parts["compute"] >= overheads[name]:
        return (f"Compute dominates ({seconds(e.compute.total_s)} of a {seconds(e.step_s)} step); the largest "
                f"overhead is {name} at {seconds(overheads[name])} exposed: {why}.")
    return (f"{name[0].upper()}{name[1:]} dominates: {seconds(overheads[name])} exposed against "
            f"{seconds(e.compute.total_s)} of compute in a {seconds(e.step_s)} step: {why}.")


def _why(e: StepEstimate, name: str) -> str:
    lay = e.setup.layout
    if name == "pipeline bubble":
        return (f"(p-1)/(v·m+p-1) = {pct(e.bubble_fraction)} of the step idles with p={lay.pp}, "
                f"m={e.micro_batches}, v={lay.vpp}")
    dim = name.split()[0]
    mine = [x for x in e.terms if x.term.dim == dim]
    terms = [x.term for x in mine]
    top = max(terms, key=lambda t: t.bytes_per_call)
    worst = max(mine, key=lambda x: x.exposed_s).term       # its window explains the exposure
    whats = " + ".join(dict.fromkeys(t.what for t in terms))
    return (f"{whats}: {sum(t.calls_per_step for t in terms):g} calls of up to {nbytes(top.bytes_per_call)} per "
            f"step over {top.group_size} GPUs ({top.scope}-node, {top.link_gb_s:.0f} GB/s bus, {top.latency_us:.0f} µs)"
            f" take {seconds(sum(t.time_s for t in terms))}; "
            + (f"most of the exposed part is {worst.what}, and " if len(terms) > 1 else "")
            + WHY[worst.window])
