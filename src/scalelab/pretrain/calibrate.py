"""Calibrated throughput and memory forms for the pretraining predictor, fitted on measured runs.

Throughput, per device; one optimizer step is k micro-steps of b = B·T tokens:

    step_s = k·b·( F_exec / (peak·u) + q·V / HBM ) + t_step           tokens/s = world·k·b / step_s
    F_exec = 6N + f_attn·12·L·d·T

  6N + 12·L·d·T are the model FLOPs per token (Kaplan et al. 2020 sec. 2.1; PaLM, Chowdhery et al. 2022, app. B,
  which counts the full T x T attention square). f_attn = 1/2: causal FlashAttention skips the blocks above the
  diagonal (Dao 2023, FlashAttention-2 sec. 3.1), so half the square is executed. q·V/HBM is the loss: the
  softmax cross-entropy over V logits is memory-bound, a per-token cost that does not grow with the model, so
  it is a larger share of a small model's step. q = 16 bytes moved per logit outside the head matmul (forward:
  read the bf16 logits twice for max and log-sum-exp, 4; backward: read them again 2, write the fp32 gradient 4,
  read it 4, write it as bf16 2). Under train.loss_chunks (chunked_ce.py) the loss reads each bf16 chunk twice
  and writes its bf16 gradient once, 6 bytes: q·s with s = 6/16 (Workload.loss_bytes_scale). t_step is paid once
  per optimizer step (AdamW, grad-norm, host sync). Fitted: u and t_step. Counted: f_attn, q and s.

Memory, per device, at the peak (the start of backward, when every saved activation is alive):

    peak_bytes = static + r + b·(c·A + G)

  static: the parameter, gradient, AdamW and DDP-bucket bytes the trainer holds then (predict.peak_static_bytes);
  A: activation bytes saved per token (Korthikanti et al. 2022 eq. 1, adapted in predict.activation_bytes);
  G: bytes per token of the logits tensors alive at the peak (predict.compiled_logits_bytes).
  Fitted: c (1 when the count is right) and r (allocator and library workspaces).

A recipe family whose kernels differ from the bf16 path's (FP8 matmuls with per-row scales, RecipeFit) gets its
own u, fitted on its runs of some rounds and scored on later ones. Its runs all train the same model on 524,288
tokens per step, so u and t_step cannot be told apart on them: t_step stays the bf16 fit's (same trainer loop).

Intervals come from the rows the constants were not fitted on: the half-width e is the largest held-out
|predicted/measured - 1|, and a prediction p gets [p/(1+e), p/(1-e)], the narrowest interval of that form
that would have held every held-out measurement.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from scalelab.core.hardware import Hardware
from scalelab.core.jsonio import is_stored, read_json, write_json
from scalelab.core.provenance import git_sha
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.params import law_params
from scalelab.pretrain.scaling_law import LossPoint, ScalingLaw, fit_scaling_law

GIB = 2**30
BYTES_PER_LOGIT = 16.0              # q above: counted, not fitted
ATTENTION_EXECUTED_FRACTION = 0.5   # f_attn above: causal mask
GOAL_REL = 0.10                     # the bar: predicted within +-10% of measured
# H100 SXM and H200 share the GH100 die, its clocks and its 989 TFLOP/s dense bf16 (core/hardware.py); H200 has
# more and faster HBM (4.8 vs 3.35 TB/s). Assumed: u and t_step carry over, the memory-bound loss term scales with
# HBM bandwidth, and the memory counts are the same (only the capacity differs).
TRANSFERABLE = {"h200": ("h100-sxm",), "h100-sxm": ("h200",)}


@dataclass(frozen=True)
class Workload:
    """One training setup as the forms see it, per device."""
    tokens_per_micro: int           # b = B·T
    micro_steps: int                # k, gradient-accumulation steps per optimizer step
    world: int
    model_flops_per_token: float    # 6N + 12·L·d·T
    attn_flops_per_token: float     # the 12·L·d·T part
    vocab: int                      # V, logits the loss reads per token
    static_bytes: float
    activation_bytes_per_token: float   # A
    logits_bytes_per_token: float       # G
    loss_bytes_scale: float = 1.0       # s: the loss's traffic per logit against the unchunked loss's q


@dataclass(frozen=True)
class ThroughputFit:
    mfu_matmul: float               # u
    step_overhead_s: float          # t_step
    bytes_per_logit: float          # q
    attention_executed_fraction: float
    peak_flops_per_s: float
    hbm_bytes_per_s: float


@dataclass(frozen=True)
class MemoryFit:
    activation_scale: float         # c
    runtime_bytes: float            # r


@dataclass(frozen=True)
class RecipeFit:
    """A recipe family's own u beside the bf16 calibration, whose t_step and loss term it shares."""
    family: str                     # predict.recipe_family's name, e.g. 'fp8-row'
    mfu_matmul: float               # u of this family, on the same executed FLOPs and bf16 peak
    tokens_per_s_rel: float         # interval half-width e from this family's held-out rows
    fitted_on: tuple[str, ...]


@dataclass(frozen=True)
class Calibration:
    hardware: str                   # hardware-table key the constants hold for
    throughput: ThroughputFit
    memory: MemoryFit
    tokens_per_s_rel: float         # interval half-width e from held-out rows
    memory_rel: float
    fitted_on: tuple[str, ...]
    source: str                     # file it was read from, or a description
    note: str = ""                  # how it reached this hardware when transferred
    recipes: tuple[RecipeFit, ...] = ()


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    role: str                       # "fit" or "held-out"
    source: str                     # results file and the keys of the measurement
    workload: Workload
    tokens_per_s: float             # measured, all devices together
    peak_memory_gib: float | None   # measured per device (torch.cuda.max_memory_allocated); None = not recorded


@dataclass(frozen=True)
class RowScore:
    key: str
    role: str
    tokens_per_s_predicted: float
    tokens_per_s_measured: float
    tokens_per_s_ratio: float       # predicted / measured
    memory_gib_predicted: float
    memory_gib_measured: float | None
    memory_ratio: float | None


# ---------------------------------------------------------------------------------------------
# the forms


def loss_seconds_per_token(w: Workload, t: ThroughputFit) -> float:
    """q·s·V / HBM: the memory-bound loss's time per token."""
    return t.bytes_per_logit * w.loss_bytes_scale * w.vocab / t.hbm_bytes_per_s


def seconds_per_token(w: Workload, t: ThroughputFit) -> float:
    executed = w.model_flops_per_token - (1.0 - t.attention_executed_fraction) * w.attn_flops_per_token
    return executed / (t.peak_flops_per_s * t.mfu_matmul) + loss_seconds_per_token(w, t)


def step_time_s(w: Workload, t: ThroughputFit) -> float:
    return w.micro_steps * w.tokens_per_micro * seconds_per_token(w, t) + t.step_overhead_s


def tokens_per_s(w: Workload, t: ThroughputFit) -> float:
    """All devices together; communication is assumed hidden behind backward (DDP buckets, FSDP2 prefetch)."""
    return w.world * w.micro_steps * w.tokens_per_micro / step_time_s(w, t)


def peak_memory_bytes(w: Workload, m: MemoryFit) -> float:
    per_token = m.activation_scale * w.activation_bytes_per_token + w.logits_bytes_per_token
    return w.static_bytes + m.runtime_bytes + w.tokens_per_micro * per_token


def interval(value: float, rel: float) -> tuple[float, float]:
    """[p/(1+e), p/(1-e)]: every measurement m with |p/m - 1| <= e lies inside."""
    return value / (1.0 + rel), (value / (1.0 - rel) if rel < 1.0 else math.inf)


# ---------------------------------------------------------------------------------------------
# fitting


def _linear_terms(r: Row, t: ThroughputFit) -> tuple[float, float]:
    """(k·b·F_exec/peak, step_s - k·b·q·s·V/HBM) of a measured row at t's loss term: the step time, less the
    loss, is the first term times 1/u plus t_step."""
    w, tokens = r.workload, r.workload.micro_steps * r.workload.tokens_per_micro
    compute_at_peak_s = tokens * seconds_per_token(w, replace(t, mfu_matmul=1.0, bytes_per_logit=0.0))
    return compute_at_peak_s, w.world * tokens / r.tokens_per_s - tokens * loss_seconds_per_token(w, t)


def fit_throughput(rows: Sequence[Row], hw: Hardware, bytes_per_logit: float = BYTES_PER_LOGIT,
                   attention_executed_fraction: float = ATTENTION_EXECUTED_FRACTION) -> ThroughputFit:
    """Least squares for (1/u, t_step), which enter the measured step time linearly:
    step_s - k·b·q·V/HBM = [k·b·F_exec/peak] · (1/u) + 1 · t_step."""
    if len(rows) < 2:
        raise ValueError(f"fit_throughput: {len(rows)} rows; need >= 2 (two constants)")
    probe = ThroughputFit(1.0, 0.0, bytes_per_logit, attention_executed_fraction, hw.bf16_flops, hw.hbm_bytes_s)
    terms = [_linear_terms(r, probe) for r in rows]
    design, target = [[x, 1.0] for x, _ in terms], [y for _, y in terms]
    (inv_u, overhead), *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    return replace(probe, mfu_matmul=float(1.0 / inv_u), step_overhead_s=float(overhead))


def fit_recipe_mfu(rows: Sequence[Row], base: ThroughputFit) -> float:
    """Least squares for 1/u alone, t_step and the loss term held at base's:
    step_s - k·b·q·s·V/HBM - t_step = [k·b·F_exec/peak] · (1/u)."""
    if not rows:
        raise ValueError("fit_recipe_mfu: no rows")
    x, y = np.array([_linear_terms(r, base) for r in rows]).T
    return float(np.dot(x, x) / np.dot(x, y - base.step_overhead_s))


def calibrate_recipe(rows: Sequence[Row], c: Calibration, family: str) -> tuple[RecipeFit, list[RowScore]]:
    """The family's u fitted on its 'fit' rows; every row scored (tokens/s only); the interval from the others."""
    fit_rows = [r for r in rows if r.role == "fit"]
    t = replace(c.throughput, mfu_matmul=fit_recipe_mfu(fit_rows, c.throughput))
    scores = score(rows, t, c.memory)
    fit = RecipeFit(family, t.mfu_matmul, held_out_half_width(scores, "tokens_per_s"), tuple(r.key for r in fit_rows))
    return fit, scores


def for_recipe(c: Calibration, family: str) -> Calibration | None:
    """The calibration as it applies to a recipe family: its u and interval, or None when it has no fit."""
    fit = next((f for f in c.recipes if f.family == family), None)
    if fit is None:
        return None
    t = replace(c.throughput, mfu_matmul=fit.mfu_matmul)
    return replace(c, throughput=t, tokens_per_s_rel=fit.tokens_per_s_rel, fitted_on=fit.fitted_on,
                   note="; ".join(filter(None, (c.note, f"{family} recipe family's u, t_step from the bf16 fit"))))


def fit_memory(rows: Sequence[Row]) -> MemoryFit:
    """Least squares for (c, r): peak - static - b·G = [b·A]·c + 1·r."""
    usable = [r for r in rows if r.peak_memory_gib is not None]
    if len(usable) < 2:
        raise ValueError(f"fit_memory: {len(usable)} rows with a peak memory; need >= 2 (two constants)")
    design = [[r.workload.tokens_per_micro * r.workload.activation_bytes_per_token, 1.0] for r in usable]
    target = [r.peak_memory_gib * GIB - r.workload.static_bytes
              - r.workload.tokens_per_micro * r.workload.logits_bytes_per_token for r in usable]
    (scale, runtime), *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    return MemoryFit(activation_scale=float(scale), runtime_bytes=float(runtime))


def score(rows: Sequence[Row], t: ThroughputFit, m: MemoryFit) -> list[RowScore]:
    out = []
    for r in rows:
        tps = tokens_per_s(r.workload, t)
        mem = peak_memory_bytes(r.workload, m) / GIB
        out.append(RowScore(key=r.key, role=r.role, tokens_per_s_predicted=tps, tokens_per_s_measured=r.tokens_per_s,
                            tokens_per_s_ratio=tps / r.tokens_per_s, memory_gib_predicted=mem,
                            memory_gib_measured=r.peak_memory_gib,
                            memory_ratio=None if r.peak_memory_gib is None else mem / r.peak_memory_gib))
    return out


def held_out_half_width(scores: Sequence[RowScore], which: str) -> float:
    """Largest |ratio - 1| over the held-out rows (which = 'tokens_per_s' or 'memory')."""
    ratios = [getattr(s, f"{which}_ratio") for s in scores if s.role == "held-out"]
    ratios = [x for x in ratios if x is not None]
    if not ratios:
        raise ValueError(f"no held-out rows with a measured {which}: an interval needs at least one")
    return max(abs(x - 1.0) for x in ratios)


def calibrate(rows: Sequence[Row], hw: Hardware, source: str) -> tuple[Calibration, list[RowScore]]:
    """Fit on the rows whose role is 'fit', score every row, take the intervals from the held-out ones."""
    fit_rows = [r for r in rows if r.role == "fit"]
    t, m = fit_throughput(fit_rows, hw), fit_memory(fit_rows)
    scores = score(rows, t, m)
    cal = Calibration(hardware=hw.key, throughput=t, memory=m,
                      tokens_per_s_rel=held_out_half_width(scores, "tokens_per_s"),
                      memory_rel=held_out_half_width(scores, "memory"),
                      fitted_on=tuple(r.key for r in fit_rows), source=source)
    return cal, scores


# ---------------------------------------------------------------------------------------------
# storage and use on other hardware


def calibration_to_dict(c: Calibration) -> dict:
    return {"hardware": c.hardware, "throughput_fit": asdict(c.throughput), "memory_fit": asdict(c.memory),
            "intervals": {"tokens_per_s_rel": c.tokens_per_s_rel, "memory_rel": c.memory_rel},
            "fitted_on": list(c.fitted_on), "recipe_fits": [asdict(f) for f in c.recipes]}


def calibration_from_dict(d: dict, source: str) -> Calibration:
    return Calibration(hardware=d["hardware"], throughput=ThroughputFit(**d["throughput_fit"]),
                       memory=MemoryFit(**d["memory_fit"]), tokens_per_s_rel=d["intervals"]["tokens_per_s_rel"],
                       memory_rel=d["intervals"]["memory_rel"], fitted_on=tuple(d["fitted_on"]), source=source,
                       recipes=tuple(RecipeFit(**{**f, "fitted_on": tuple(f["fitted_on"])})
                                     for f in d.get("recipe_fits", ())))


def load_calibration(path: str | Path) -> Calibration | None:
    path = Path(path)
    return calibration_from_dict(read_json(path), str(path)) if is_stored(path) else None  # plain or packed


def for_hardware(c: Calibration, hw: Hardware) -> Calibration | None:
    """The calibration as it applies on `hw`: itself, transferred (TRANSFERABLE), or None."""
    if hw.key == c.hardware:
        return c
    if hw.key not in TRANSFERABLE.get(c.hardware, ()):
        return None
    t = replace(c.throughput, peak_flops_per_s=hw.bf16_flops, hbm_bytes_per_s=hw.hbm_bytes_s)
    return replace(c, hardware=hw.key, throughput=t,
                   note=f"transferred from {c.hardware}: same u and per-step overhead (same compute die), "
                        f"loss term at {hw.key}'s HBM bandwidth")


# ---------------------------------------------------------------------------------------------
# the loss ladder: final val losses of small runs -> L(N, D) fit (scaling_law.fit_scaling_law)


@dataclass(frozen=True)
class LadderLaw:
    law: ScalingLaw | None
    reason: str                     # why it is (not) used


def ladder_point(run_dir: Path) -> dict | None:
    """A finished ladder run folder -> its point; None while it is unfinished or has no val loss."""
    summary, prov = run_dir / "train_summary.json", run_dir / "provenance.json"
    if not (summary.is_file() and (run_dir / "config.toml").is_file()):
        return None
    s, cfg = read_json(summary), load_pretrain_config(run_dir / "config.toml")
    loss = s.get("final_val_loss")
    if s.get("steps", 0) < cfg.train.max_steps or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        return None
    m = cfg.model
    return {"name": run_dir.name, "n_params": law_params(m), "tokens": int(s["tokens"]),
            "final_val_loss": float(loss), "n_layer": m.n_layer, "n_embd": m.n_embd, "lr": cfg.optim.lr,
            "steps": int(s["steps"]), "data_manifest_sha256": read_json(prov).get("data_manifest_sha256")
            if prov.is_file() else None}


def collect_ladder(run_root: str | Path, out_path: str | Path, command: str = "") -> dict:
    """Merge the finished runs under run_root into out_path (points kept by name), refit, write, return it."""
    out_path = Path(out_path)
    old = read_json(out_path) if out_path.is_file() else {}
    points = {p["name"]: p for p in old.get("points", [])}
    for run_dir in sorted(Path(run_root).glob("*/")):
        point = ladder_point(run_dir)
        if point is not None:
            points[point["name"]] = point
    rows = sorted(points.values(), key=lambda p: (p["n_params"], p["tokens"]))
    shas = {p["data_manifest_sha256"] for p in rows}
    try:
        law, why = asdict(fit_ladder(rows)), ""
    except ValueError as e:
        law, why = None, str(e)
    doc = {"schema": "scalelab.scaling_ladder/1",
           "what": "final val loss of GPT-2-family runs over model size N and token budget D, for "
                   "L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022, eq. 2)",
           "data_manifest_sha256": shas.pop() if len(shas) == 1 else None, "points": rows,
           "law": law, "law_error": why, "command": command or old.get("command", ""), "git_sha": git_sha()}
    write_json(out_path, doc)
    return doc


def fit_ladder(points: Sequence[dict]) -> ScalingLaw:
    """The L(N, D) fit, refused (ValueError) when no (α, β) gives non-negative E, A, B: the points do not
    fall with N and D as the law requires (too few steps, or a diverged run)."""
    law = fit_scaling_law([LossPoint(p["n_params"], p["tokens"], p["final_val_loss"]) for p in points],
                          source="local ladder fit")
    if not math.isfinite(law.rel_interval) or min(law.E, law.A, law.B) < 0:
        raise ValueError(f"ladder fit: no law with E, A, B >= 0 fits these {len(points)} points")
    return law


def ladder_law(path: str | Path, data_manifest_sha256: str | None) -> LadderLaw:
    """The law fitted on a ladder file, when it has >= 5 points on the same data as the run being predicted."""
    path = Path(path)
    if not path.is_file():
        return LadderLaw(None, f"no ladder file at {path} (bench/gpu_scaling_ladder.sh writes it)")
    doc = read_json(path)
    points = doc.get("points", [])
    if len(points) < 5:
        return LadderLaw(None, f"{path}: {len(points)} finished runs; the fit needs >= 5")
    if data_manifest_sha256 is None or doc.get("data_manifest_sha256") != data_manifest_sha256:
        return LadderLaw(None, f"{path} was measured on other data (manifest "
                               f"{str(doc.get('data_manifest_sha256'))[:12]}) than this run's")
    try:
        law = fit_ladder(points)
    except ValueError as e:
        return LadderLaw(None, f"{path}: {e}")
    return LadderLaw(replace(law, source=f"local ladder fit: {path} ({len(points)} runs, same data manifest)"),
                     "ladder on the same data")
