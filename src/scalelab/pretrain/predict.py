"""Before the run: predicted tokens/s, memory per device and final loss, each with a stated interval.

    tokens/s = MFU x peak FLOP/s x world / FLOPs-per-token          (PaLM, Chowdhery et al. 2022, app. B)
    memory   = params + grads + AdamW m, v + activations + logits + runtime
    loss     = E + A / N^α + B / D^β                                (Hoffmann et al. 2022, eq. 2)

Throughput and memory come from one of two sources, and the prediction says which:
- calibrated: the forms of calibrate.py with constants fitted on measured runs
  (the committed calibration that bench/pretrain_calibration.py writes; CALIBRATION_PATH), used for bf16 +
  torch.compile runs on the calibrated hardware or one it transfers to (calibrate.TRANSFERABLE): without FP8,
  or, for throughput only, in a recipe family with its own fit (FP8 with per-row scales); the interval is the
  largest error on the rows the constants were not fitted on;
- prior: an MFU from a table per hardware (below, with where each number comes from) and the byte counts here.
The loss law is, in order: one given by the caller; a fit on a local ladder of small runs on the same data
(the ladder bench/gpu_scaling_ladder.sh writes; LADDER_PATH); else the Chinchilla prior.
predictions.json is written through RunDir, which logs its sha256, so a report can show the prediction existed
before the measurement.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from scalelab.core.hardware import Hardware, MfuAssumption, resolve_hardware
from scalelab.core.rundir import RunDir
from scalelab.pretrain import calibrate as cal
from scalelab.pretrain.config import ModelConfig, PretrainConfig, load_pretrain_config
from scalelab.pretrain.params import count_params, law_params
from scalelab.pretrain.scaling_law import CHINCHILLA_PRIOR, ScalingLaw, load_scaling_law
from scalelab.pretrain.shards import ShardError, manifest_hash
from scalelab.pretrain.train_gpt import flops_per_token

GIB = 2**30
# the repository's committed pretrain run folders (a checkout's, not an installed package's)
_RESULTS = Path(__file__).resolve().parents[3] / "results" / "h200" / "pretrain"
CALIBRATION_PATH = Path(os.environ.get("SCALELAB_PRETRAIN_CALIBRATION",
                                       _RESULTS / "predictor-calibration" / "results.json"))
LADDER_PATH = Path(os.environ.get("SCALELAB_SCALING_LADDER", _RESULTS / "scaling-ladder" / "results.json"))
AUTO = "auto"  # predict(calibration=AUTO): read CALIBRATION_PATH when it exists


# Per hardware-table key. GPU rows assume bf16 autocast + torch.compile on a GPT-2-124M-sized model.
MFU_DEFAULTS: dict[str, MfuAssumption] = {
    # Measured by us with train_gpt.py on this 2-core CPU, fp32, tiny config (4x128, T=128), against the
    # table's nominal 0.192 TFLOP/s: 0.21 at B=8 with OMP_NUM_THREADS=2; 0.14 at B=16 (OMP=2) and 0.09 at B=16
    # (OMP=1) while other jobs shared the CPU. Timings on a shared CPU are noisy, hence the wide interval.
    "cpu": MfuAssumption(0.15, 0.06, 0.25, "measured: train_gpt.py tiny config on the 2-core CPU, fp32, "
                                            "0.09-0.21 depending on threads, batch and load"),
    # Leads, not our measurements. modded-nanogpt's README starts its speedrun from llm.c's 45-minute GPT-2 124M
    # run on 8xH100 (10B tokens); a published llm.c 8xH100 log shows 140 ms per 524,288-token step: 3.7M tokens/s,
    # i.e. MFU ~0.40 by our 855 MFLOPs/token and 989 TFLOP/s peak. H200 has H100's compute. Replace with a value
    # measured on the machine (the `mfu` field of train events).
    "h100-sxm": MfuAssumption(0.40, 0.25, 0.55, "lead: llm.c GPT-2 124M on 8xH100 (140 ms/step, ~3.7M tok/s), "
                                                "bf16 + compile"),
    "h200": MfuAssumption(0.40, 0.25, 0.55, "lead: as H100 (same compute): llm.c GPT-2 124M, bf16 + compile"),
    "a100-80gb": MfuAssumption(0.45, 0.30, 0.60, "guess: the H100 lead, a little higher on A100's lower peak"),
    "l40s": MfuAssumption(0.35, 0.20, 0.50, "guess: Ada GPU, bf16 + compile; no report at hand"),
}
# nanoGPT README: torch.compile took a 124M iteration from ~250 ms to ~135 ms on A100, so eager ~0.55x.
EAGER_GPU_FACTOR = 0.55
# Peak RSS of `import torch` plus first matmul/SDPA on this machine: 0.22 GiB; CPU memory is measured as process
# RSS (train_gpt.memory_gib), so it is part of what we predict. On GPU max_memory_allocated excludes the context.
CPU_RUNTIME_BYTES = int(0.25 * GIB)
# Allocator fragmentation and caching, and temporaries we do not model: measured peak RSS / point estimate was
# 1.13-1.14 (tiny config, B=8) and 1.07-1.09 (B=16) on this CPU.
MEMORY_INTERVAL = (0.8, 1.3)


@dataclass(frozen=True)
class ThroughputEstimate:
    flops_per_token: float          # training FLOPs, 6N + attention (train_gpt.flops_per_token)
    peak_flops_per_s: float         # per device, hardware table
    world_size: int
    assumed_mfu: float
    assumed_mfu_low: float
    assumed_mfu_high: float
    mfu_why: str
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    step_ms: float
    step_ms_low: float
    step_ms_high: float
    train_tokens: int
    wall_s: float
    wall_s_low: float
    wall_s_high: float
    model: str = "prior"            # "calibrated" (calibrate.py forms, fitted constants) or "prior" (MFU table)


@dataclass(frozen=True)
class MemoryEstimate:               # per device, at the peak (loss backward)
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int            # AdamW m and v in fp32: 8 bytes/param
    comm_buffers_bytes: int         # DDP gradient buckets
    activations_bytes: int          # saved for backward in the blocks
    logits_bytes: int               # logits, log-softmax and their gradients: dominant for small models
    runtime_bytes: int              # process baseline counted by the measurement (CPU RSS)
    total_bytes: int
    total_bytes_low: int
    total_bytes_high: int
    device_memory_bytes: int
    model: str = "prior"            # "calibrated": activation scale and runtime fitted; "prior": counts only


@dataclass(frozen=True)
class LossEstimate:
    final_loss: float               # nats/token on the val split
    final_loss_low: float
    final_loss_high: float
    n_params: int                   # N in the law: all parameters except the position table
    train_tokens: int               # D
    uniform_loss: float             # ln(vocab): the loss of a model that learned nothing
    law: ScalingLaw


@dataclass(frozen=True)
class PretrainPrediction:
    run_name: str
    hardware_key: str
    hardware_name: str
    dtype: str
    n_params: int
    throughput: ThroughputEstimate
    memory: MemoryEstimate
    loss: LossEstimate


# ---------------------------------------------------------------------------------------------
# compute


def resolve_target(cfg: PretrainConfig, hardware_key: str) -> Hardware:
    """'auto' -> run.gpu if set, else the CPU when train.device says so, else the detected accelerator."""
    key = hardware_key if hardware_key != "auto" else cfg.run.gpu
    return resolve_hardware(key, "cpu" if cfg.train.device == "cpu" else None)


def train_dtype(cfg: PretrainConfig, hw: Hardware) -> str:
    if cfg.train.dtype != "auto":
        return cfg.train.dtype
    return "float32" if hw.key == "cpu" else "bfloat16"  # as train_gpt: bf16 autocast on cuda, fp32 on cpu


def mfu_assumption(cfg: PretrainConfig, hw: Hardware, override: float | None) -> MfuAssumption:
    if override is not None:
        return MfuAssumption(override, override * 0.8, min(1.0, override * 1.2), "given by the user (±20%)")
    base = MFU_DEFAULTS.get(hw.key, MfuAssumption(0.3, 0.15, 0.5, "no table entry for this hardware: a guess"))
    if hw.key != "cpu" and not cfg.train.compile:
        return MfuAssumption(base.mfu * EAGER_GPU_FACTOR, base.mfu_low * EAGER_GPU_FACTOR,
                             base.mfu_high * EAGER_GPU_FACTOR, base.why + f"; x{EAGER_GPU_FACTOR} without compile "
                             "(nanoGPT README: ~250 -> ~135 ms/iter with compile)")
    return base


def train_tokens(cfg: PretrainConfig, tokens_per_step: int) -> int:
    total = cfg.train.max_steps * tokens_per_step
    return min(total, cfg.train.token_budget) if cfg.train.token_budget else total


def _throughput_record(cfg: PretrainConfig, hw: Hardware, world: int, rates: tuple[float, float, float],
                       mfus: tuple[float, float, float], why: str, model: str) -> ThroughputEstimate:
    """rates = (point, low, high) tokens/s over all devices, mfus the same as model FLOPs utilisation."""
    tok_step = cfg.train.micro_batch_size * cfg.model.block_size * world * cfg.grad_accum(world)
    tps, lo, hi = rates
    d = train_tokens(cfg, tok_step)
    return ThroughputEstimate(
        flops_per_token=flops_per_token(cfg.model, count_params(cfg.model)), peak_flops_per_s=hw.bf16_flops,
        world_size=world, assumed_mfu=mfus[0], assumed_mfu_low=mfus[1], assumed_mfu_high=mfus[2], mfu_why=why,
        tokens_per_step=tok_step,
        tokens_per_s=tps, tokens_per_s_low=lo, tokens_per_s_high=hi,
        step_ms=1000 * tok_step / tps, step_ms_low=1000 * tok_step / hi, step_ms_high=1000 * tok_step / lo,
        train_tokens=d, wall_s=d / tps, wall_s_low=d / hi, wall_s_high=d / lo, model=model)


def estimate_throughput(cfg: PretrainConfig, hw: Hardware, world: int, mfu: MfuAssumption) -> ThroughputEstimate:
    fpt = flops_per_token(cfg.model, count_params(cfg.model))
    rate = lambda u: u * hw.bf16_flops * world / fpt  # noqa: E731  tokens/s at MFU u
    return _throughput_record(cfg, hw, world, (rate(mfu.mfu), rate(mfu.mfu_low), rate(mfu.mfu_high)),
                              (mfu.mfu, mfu.mfu_low, mfu.mfu_high), mfu.why, "prior")


def calibrated_throughput(cfg: PretrainConfig, hw: Hardware, world: int, c: cal.Calibration) -> ThroughputEstimate:
    t, fpt = c.throughput, flops_per_token(cfg.model, count_params(cfg.model))
    tps = cal.tokens_per_s(workload(cfg, world), t)
    lo, hi = cal.interval(tps, c.tokens_per_s_rel)
    mfu = lambda r: r * fpt / (hw.bf16_flops * world)  # noqa: E731  implied MFU (PaLM app. B)
    fitted = (", ".join(c.fitted_on) if len(c.fitted_on) <= 3
              else f"{len(c.fitted_on)} runs, {c.fitted_on[0]} to {c.fitted_on[-1]}")
    why = (f"calibrated ({c.source}; fitted on {fitted}): u={t.mfu_matmul:.3f} of peak on the "
           f"executed FLOPs, {t.bytes_per_logit:g} B/logit of loss traffic at {t.hbm_bytes_per_s / 1e12:.2f} TB/s, "
           f"{1000 * t.step_overhead_s:.2f} ms per optimizer step; interval +-{c.tokens_per_s_rel:.1%} = largest "
           f"held-out error" + (f"; {c.note}" if c.note else ""))
    return _throughput_record(cfg, hw, world, (tps, lo, hi), (mfu(tps), mfu(lo), mfu(hi)), why, "calibrated")


def activation_bytes(m: ModelConfig, micro_batch: int, dtype: str, fp8_inputs: bool = False) -> int:
    """Tensors the blocks save for backward, per device. Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models") eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer at 16-bit, where
    34 = 2 bytes x (14 matmul/GELU inputs + 2 LayerNorm inputs) + 2 one-byte dropout masks per s·b·h, and
    5·a·s/h is the stored a·s² attention matrix (softmax 2 + mask 1 + dropout output 2 bytes). Adapted to
    train_gpt: SDPA (flash / memory-efficient, on GPU and CPU) keeps only a fp32 logsumexp per head and
    position instead of a·s²; matmul inputs at the autocast dtype (fp32 on CPU); LayerNorm inputs in fp32
    (autocast runs layer_norm in fp32); dropout masks only when dropout > 0. fp8_inputs (train.fp8 per-tensor in
    the blocks, fp8._FP8Matmul): the four Linears keep their inputs (7 of the 14 per s·b·h) as one-byte e4m3."""
    s, b, h, a = m.block_size, micro_batch, m.n_embd, m.n_head
    act = 4 if dtype == "float32" else 2
    masks = 2 if m.dropout > 0 else 0
    inputs = 7 * 1 + 7 * act if fp8_inputs else 14 * act
    per_layer = s * b * h * (inputs + 2 * 4 + masks) + 4 * a * s * b
    return m.n_layer * per_layer + s * b * h * (4 + act)  # + ln_f input (fp32) and lm_head input


def logits_bytes(m: ModelConfig, micro_batch: int, dtype: str) -> int:
    """Peak around the loss, in B·T·V units: the lm_head output (padded vocab, autocast dtype), the fp32
    log-softmax, and the fp32 gradients of log-softmax and of the logits. The trainer drops its reference
    to the logits before backward, but the measured CPU peak RSS (a high-water mark, 1.07-1.14x this
    estimate on the tiny config) still holds all four; eager mode, no fusion (torch.compile fuses them)."""
    act = 4 if dtype == "float32" else 2
    return micro_batch * m.block_size * (act * m.padded_vocab_size + 3 * 4 * m.vocab_size)


def compiled_logits_bytes(m: ModelConfig, micro_batch: int) -> int:
    """Logits alive at the peak under torch.compile with bf16 autocast: the bf16 head output (padded vocab) and
    one fp32 V-wide tensor (the loss gradient); the compiled graph fuses log-softmax with its backward, so the
    eager path's fp32 copy and log-softmax output (logits_bytes) are not both kept."""
    return micro_batch * m.block_size * (2 * m.padded_vocab_size + 4 * m.vocab_size)


# fp32 copies of one loss chunk that the compiled torch path of the chunked loss holds at its peak (the masked
# logits, their exp, the gradient, and a buffer Inductor keeps): read off one measured chunked-loss run's peak
# memory (bench/pretrain_calibration.py), and checked against another batch size it was not read from
CHUNK_FP32_COPIES = 4
# bytes the chunked loss moves per logit outside the head's matmuls: each bf16 chunk read twice (max/sum-exp,
# then the gradient) and its bf16 gradient written once (the Triton kernel in place; the compiled torch path
# fuses the gradient and its cast), against the unchunked loss's 16 (calibrate.BYTES_PER_LOGIT)
CHUNKED_LOSS_BYTES_PER_LOGIT = 6.0


def chunked_loss_bytes(m: ModelConfig, micro_batch: int, chunks: int, kernel: str, fp8_head: bool) -> int:
    """Loss-side bytes alive at the peak with train.loss_chunks (chunked_ce.py), in place of the (B·T, V) logits:
    the fp32 gradients it saves in the forward (d/dh: B·T x C; d/dW: Vp x C), and one chunk's working set: its
    bf16 logits, plus the compiled torch path's fp32 copies, or nothing more where the Triton kernel writes the
    gradient over the logits, or the two e5m2 gradient layouts (triton-e5m2 with an FP8 head)."""
    tokens = micro_batch * m.block_size
    rows = -(-tokens // chunks)
    chunk = rows * m.padded_vocab_size
    saved = 4 * (tokens + m.padded_vocab_size) * m.n_embd
    work = {"torch": CHUNK_FP32_COPIES * 4 * chunk, "triton": 0,
            "triton-e5m2": 2 * chunk if fp8_head else 0}[kernel]
    return saved + 2 * chunk + work


def loss_peak_bytes(cfg: PretrainConfig, dtype: str, compiled: bool) -> int:
    """The loss side's share of the peak: chunked_loss_bytes under train.loss_chunks, else the whole logits as
    the compiled (compiled_logits_bytes) or eager (logits_bytes) graph keeps them."""
    m, b, t = cfg.model, cfg.train.micro_batch_size, cfg.train
    if t.loss_chunks:
        return chunked_loss_bytes(m, b, t.loss_chunks, t.loss_kernel, t.fp8 in ("lm_head", "all"))
    return compiled_logits_bytes(m, b) if compiled else logits_bytes(m, b, dtype)


@dataclass(frozen=True)
class StaticBytes:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    comm_buffers_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.comm_buffers_bytes


def peak_static_bytes(cfg: PretrainConfig, world: int) -> StaticBytes:
    """What the trainer holds besides activations at the peak (the start of backward, from the second step on):
    fp32 params and AdamW m, v (ZeRO-3-sharded under FSDP2: Rajbhandari et al. 2020); gradients only of the tied
    embedding (backward produces it first, and zero_grad(set_to_none) freed the rest), or all of them when
    accumulating (earlier micro-steps' gradients stay); DDP's gradient buckets, one more fp32 copy."""
    n, m = count_params(cfg.model), cfg.model
    shard = world if (world > 1 and cfg.train.parallel == "fsdp2") else 1
    grads = 4 * n if cfg.grad_accum(world) > 1 else 4 * m.padded_vocab_size * m.n_embd
    comm = 4 * n if (world > 1 and cfg.train.parallel == "ddp") else 0
    return StaticBytes(4 * n // shard, grads // shard, 8 * n // shard, comm)


def workload(cfg: PretrainConfig, world: int) -> cal.Workload:
    """The calibrated forms' view of one setup (bf16 autocast, torch.compile), per device."""
    m, b = cfg.model, cfg.train.micro_batch_size
    tokens = b * m.block_size
    return cal.Workload(
        tokens_per_micro=tokens, micro_steps=cfg.grad_accum(world), world=world,
        model_flops_per_token=flops_per_token(m, count_params(m)),
        attn_flops_per_token=12 * m.n_layer * m.n_embd * m.block_size, vocab=m.vocab_size,
        static_bytes=peak_static_bytes(cfg, world).total_bytes,
        activation_bytes_per_token=activation_bytes(m, b, "bfloat16") / tokens,
        logits_bytes_per_token=loss_peak_bytes(cfg, "bfloat16", compiled=True) / tokens,
        loss_bytes_scale=CHUNKED_LOSS_BYTES_PER_LOGIT / cal.BYTES_PER_LOGIT if cfg.train.loss_chunks else 1.0)


def estimate_memory(cfg: PretrainConfig, hw: Hardware, world: int, dtype: str) -> MemoryEstimate:
    """Per device. Params stay fp32 under autocast (master weights); FSDP2 shards params, grads and AdamW
    state over the world (ZeRO-3, Rajbhandari et al. 2020); DDP keeps a full copy plus gradient buckets."""
    n = count_params(cfg.model)
    shard = world if (world > 1 and cfg.train.parallel == "fsdp2") else 1
    params, grads, optim = 4 * n // shard, 4 * n // shard, 8 * n // shard
    comm = 4 * n if (world > 1 and cfg.train.parallel == "ddp") else 0
    t = cfg.train
    fp8_inputs = t.fp8 in ("blocks", "all") and t.fp8_scaling == "tensor"
    acts = activation_bytes(cfg.model, t.micro_batch_size, dtype, fp8_inputs)
    logits = loss_peak_bytes(cfg, dtype, compiled=t.compile and dtype == "bfloat16")
    runtime = CPU_RUNTIME_BYTES if hw.key == "cpu" else 0
    total = params + grads + optim + comm + acts + logits + runtime
    return MemoryEstimate(params_bytes=params, grads_bytes=grads, optimizer_bytes=optim, comm_buffers_bytes=comm,
                          activations_bytes=acts, logits_bytes=logits, runtime_bytes=runtime, total_bytes=total,
                          total_bytes_low=int(total * MEMORY_INTERVAL[0]),
                          total_bytes_high=int(total * MEMORY_INTERVAL[1]),
                          device_memory_bytes=int(hw.memory_bytes))


def calibrated_memory(cfg: PretrainConfig, hw: Hardware, world: int, c: cal.Calibration) -> MemoryEstimate:
    w, st = workload(cfg, world), peak_static_bytes(cfg, world)
    acts = int(c.memory.activation_scale * w.activation_bytes_per_token * w.tokens_per_micro)
    logits = int(w.logits_bytes_per_token * w.tokens_per_micro)
    runtime = int(c.memory.runtime_bytes)
    total = st.total_bytes + acts + logits + runtime
    lo, hi = cal.interval(total, c.memory_rel)
    return MemoryEstimate(params_bytes=st.params_bytes, grads_bytes=st.grads_bytes,
                          optimizer_bytes=st.optimizer_bytes, comm_buffers_bytes=st.comm_buffers_bytes,
                          activations_bytes=acts, logits_bytes=logits, runtime_bytes=runtime, total_bytes=total,
                          total_bytes_low=int(lo), total_bytes_high=int(hi), device_memory_bytes=int(hw.memory_bytes),
                          model="calibrated")


def estimate_loss(cfg: PretrainConfig, tokens: int, law: ScalingLaw) -> LossEstimate:
    """L(N, D) with its stated relative interval, capped at ln(V): a model that learned nothing predicts the
    uniform distribution, and the prior extrapolated to a few thousand tokens would claim worse than that."""
    n = law_params(cfg.model)
    uniform = math.log(cfg.model.vocab_size)
    point = min(law.loss(n, max(tokens, 1)), uniform)
    return LossEstimate(final_loss=point, final_loss_low=point * (1 - law.rel_interval),
                        final_loss_high=min(uniform, point * (1 + law.rel_interval)), n_params=n,
                        train_tokens=tokens, uniform_loss=uniform, law=law)


def recipe_family(cfg: PretrainConfig) -> str:
    """Runs whose kernels share one calibrated u: 'bf16' (no FP8); 'fp8-row' (every Linear in FP8 with per-row
    scales and the chunked FP8 head: the measured recipe family); else 'fp8-<which>-<scaling>[-chunked]'."""
    t = cfg.train
    if t.fp8 == "none":
        return "bf16"
    if t.fp8 == "all" and t.fp8_scaling == "row" and t.loss_chunks:
        return "fp8-row"
    return f"fp8-{t.fp8}-{t.fp8_scaling}" + ("-chunked" if t.loss_chunks else "")


def calibration_for(cfg: PretrainConfig, hw: Hardware, dtype: str,
                    calibration: cal.Calibration | str | None) -> tuple[cal.Calibration | None, str]:
    """(the calibration that applies to this run's throughput, or None; why). It covers what was measured: bf16
    autocast and torch.compile, without FP8 or in a recipe family with its own fit (calibrate.RecipeFit), on the
    calibrated hardware or one it transfers to."""
    if calibration is None:
        return None, "not requested"
    c = cal.load_calibration(CALIBRATION_PATH) if calibration == AUTO else calibration
    if c is None:
        return None, f"no calibration file at {CALIBRATION_PATH}"
    if dtype != "bfloat16" or not cfg.train.compile:
        return None, "calibrated on bf16 + torch.compile; this run differs"
    moved = cal.for_hardware(c, hw)
    if moved is None:
        return None, f"calibrated on {c.hardware}, not transferable to {hw.key}"
    family = recipe_family(cfg)
    if family == "bf16":
        return moved, "calibrated"
    fitted = cal.for_recipe(moved, family)
    families = ", ".join(["bf16", *(f.family for f in c.recipes)])
    return (fitted, "calibrated") if fitted else (None, f"calibrated for {families}; this run is {family}")


def default_loss_law(cfg: PretrainConfig, ladder_path: str | Path | None = None) -> ScalingLaw:
    """A ladder fit on this run's data when one exists, else the Chinchilla prior (with why in its source)."""
    try:
        sha = manifest_hash(cfg.data.dir)
    except ShardError:
        sha = None
    found = cal.ladder_law(ladder_path or LADDER_PATH, sha)
    if found.law is not None:
        return found.law
    return ScalingLaw(**{**asdict(CHINCHILLA_PRIOR), "source": f"{CHINCHILLA_PRIOR.source} ({found.reason})"})


def predict(cfg: PretrainConfig, world_size: int = 1, hardware_key: str = "auto", mfu: float | None = None,
            loss_law: ScalingLaw | None = None,
            calibration: cal.Calibration | str | None = AUTO) -> PretrainPrediction:
    """calibration: AUTO (read CALIBRATION_PATH), a Calibration, or None (priors only); an explicit `mfu`
    replaces the throughput model either way."""
    hw = resolve_target(cfg, hardware_key)
    dtype = train_dtype(cfg, hw)
    c, why_not = calibration_for(cfg, hw, dtype, calibration)
    if c is not None and mfu is None:
        throughput = calibrated_throughput(cfg, hw, world_size, c)
    else:
        throughput = estimate_throughput(cfg, hw, world_size, mfu_assumption(cfg, hw, mfu))
        if c is None and calibration is not None:
            throughput = replace(throughput, mfu_why=f"{throughput.mfu_why}; not calibrated: {why_not}")
    if c is not None and recipe_family(cfg) == "bf16":  # the memory fit covers the bf16 runs only
        memory = calibrated_memory(cfg, hw, world_size, c)
    else:
        memory = estimate_memory(cfg, hw, world_size, dtype)
    return PretrainPrediction(run_name=cfg.run.name, hardware_key=hw.key, hardware_name=hw.name, dtype=dtype,
                              n_params=count_params(cfg.model), throughput=throughput, memory=memory,
                              loss=estimate_loss(cfg, throughput.train_tokens, loss_law or default_loss_law(cfg)))


# ---------------------------------------------------------------------------------------------
# save / load / print


def prediction_to_dict(p: PretrainPrediction) -> dict:
    return {"job": "pretrain", **asdict(p)}


def prediction_from_dict(d: dict) -> PretrainPrediction:
    """Inverse of prediction_to_dict (extra keys such as written_unix are ignored)."""
    loss = dict(d["loss"], law=ScalingLaw(**d["loss"]["law"]))
    return PretrainPrediction(run_name=d["run_name"], hardware_key=d["hardware_key"],
                              hardware_name=d["hardware_name"], dtype=d["dtype"], n_params=d["n_params"],
                              throughput=ThroughputEstimate(**d["throughput"]), memory=MemoryEstimate(**d["memory"]),
                              loss=LossEstimate(**loss))


def write_predictions(cfg: PretrainConfig, run_dir: str | Path | None = None, world_size: int = 1,
                      hardware_key: str = "auto", mfu: float | None = None, loss_law: ScalingLaw | None = None,
                      calibration: cal.Calibration | str | None = AUTO) -> PretrainPrediction:
    """Predict and write <run>/predictions.json; RunDir logs its sha256 as a `predictions_written` event."""
    rd = RunDir(run_dir if run_dir is not None else cfg.run_dir)
    rd.path.mkdir(parents=True, exist_ok=True)
    pred = predict(cfg, world_size, hardware_key, mfu, loss_law, calibration)
    rd.write_predictions(prediction_to_dict(pred))
    return pred


def predict_from_args(args) -> PretrainPrediction:
    """CLI entry. Reads from `args` (argparse.Namespace; absent attributes take the default): config (TOML path
    or None), set (list of key=value overrides), world_size (1), gpu ('auto'), mfu (None = calibration or table),
    loss_law (JSON path from save_scaling_law, or None = ladder fit or Chinchilla prior), run_dir (None = the
    config's), write (True)."""
    cfg = load_pretrain_config(getattr(args, "config", None), getattr(args, "set", None) or ())
    law_path = getattr(args, "loss_law", None)
    kwargs = dict(world_size=getattr(args, "world_size", 1) or 1, hardware_key=getattr(args, "gpu", "auto") or "auto",
                  mfu=getattr(args, "mfu", None), loss_law=load_scaling_law(law_path) if law_path else None)
    if getattr(args, "write", True):
        return write_predictions(cfg, getattr(args, "run_dir", None), **kwargs)
    return predict(cfg, **kwargs)


def format_prediction(p: PretrainPrediction) -> str:
    t, m, loss = p.throughput, p.memory, p.loss
    gib = lambda x: f"{x / GIB:.2f}"  # noqa: E731
    return "\n".join([
        f"prediction for {p.run_name}: {p.n_params:,} params on {t.world_size} x {p.hardware_name} ({p.dtype})",
        f"  FLOPs/token {t.flops_per_token:.4g}; peak {t.peak_flops_per_s:.4g} FLOP/s/device; "
        f"MFU {t.assumed_mfu:.0%} ({t.assumed_mfu_low:.0%}-{t.assumed_mfu_high:.0%}): {t.mfu_why}",
        f"  throughput model: {t.model}; memory model: {m.model}",
        f"  tokens/s {t.tokens_per_s:,.0f} ({t.tokens_per_s_low:,.0f}-{t.tokens_per_s_high:,.0f}); step "
        f"{t.step_ms:,.1f} ms ({t.step_ms_low:,.1f}-{t.step_ms_high:,.1f}); {t.train_tokens:,} tokens in "
        f"{t.wall_s / 3600:.3g} h ({t.wall_s_low / 3600:.3g}-{t.wall_s_high / 3600:.3g})",
        f"  memory/device GiB: params {gib(m.params_bytes)} + grads {gib(m.grads_bytes)} + AdamW "
        f"{gib(m.optimizer_bytes)} + buckets {gib(m.comm_buffers_bytes)} + activations {gib(m.activations_bytes)} "
        f"+ logits {gib(m.logits_bytes)} + runtime {gib(m.runtime_bytes)} = {gib(m.total_bytes)} "
        f"({gib(m.total_bytes_low)}-{gib(m.total_bytes_high)}) of {gib(m.device_memory_bytes)}",
        f"  final val loss {loss.final_loss:.3f} ({loss.final_loss_low:.3f}-{loss.final_loss_high:.3f}) nats at "
        f"N={loss.n_params:,}, D={loss.train_tokens:,}; law: {loss.law.source}",
    ])
