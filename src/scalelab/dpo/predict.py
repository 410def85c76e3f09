"""Before training: predicted step time, peak memory, initial loss and held-out reward accuracy, each stated.

    step FLOPs = 2 N x tokens x passes                     (Kaplan et al. 2020: ~2N FLOPs per token forward)
      tokens  = 2 x pairs per step x mean sequence tokens  (chosen and rejected sequences)
      passes  = 1 forward + 1 backward to activations (frozen base weights need no weight grads under
                LoRA, Hu et al. 2021) + 1 reference forward (DPO/IPO unless precomputed) + 1 recompute
                forward with gradient checkpointing
    step s    = step FLOPs / (MFU x peak FLOP/s)           MFU: a prior per hardware, below
                + layers x passes x dispatch overhead      eager PyTorch launches each op from Python: a
                                                           fixed cost per layer and pass that no matmul hides
                                                           on a small model (measured on an H200, below)
    memory    = memory in use when the prediction is made (weights, runtime, allocator-held memory: read,
                not modelled) + LoRA params, grads and AdamW moments (16 B each, fp32) + activations
    loss(0)   = ln 2 for DPO: LoRA's B starts at zero, so pi = pi_ref and every margin is 0
              = (1 / (2 beta))^2 for IPO (Azar et al. 2023, eq. 17 at h = 0)
    accuracy  = 0.5 + (A - 0.5) (1 - exp(-epochs)), A = 0.75: a prior, not a derivation. zephyr-7b-beta's
                model card (DPO on UltraFeedback) reports 0.78 eval reward accuracy after training.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scalelab.core.hardware import Hardware, MfuAssumption, resolve_hardware
from scalelab.core.rundir import RunDir
from scalelab.dpo.config import DpoConfig

GIB = 2**30


# Keyed by hardware-table key. Eager HF models, no torch.compile.
MFU_PRIORS: dict[str, MfuAssumption] = {
    # Measured, tiny-cpu config (SmolLM2-135M, fp32, 4 pairs x ~60 tokens, 385 GFLOP per step by the formula
    # above): 6.2-6.6 s per step alone on the 2 cores = 0.31 of the nominal 0.192 TFLOP/s. With a second
    # 2-thread torch process on the same cores, OpenMP spin-waiting made steps 39-68 s (0.03-0.05): the low end.
    "cpu": MfuAssumption(0.30, 0.03, 0.40, "measured: tiny-cpu LoRA-DPO of SmolLM2-135M, fp32, 2 cores; "
                                      "0.31 alone, 0.03-0.05 sharing the cores with another torch job"),
    "h200": MfuAssumption(0.30, 0.10, 0.45, "guess: eager bf16 LoRA on a 7B model; a 135M model sits near the low end "
                                       "(kernel launches dominate its small matmuls)"),
    "h100-sxm": MfuAssumption(0.30, 0.10, 0.45, "guess: as h200 (same compute)"),
    "a100-80gb": MfuAssumption(0.35, 0.15, 0.50, "guess: the H100 guess, a little higher on A100's lower peak"),
    "l40s": MfuAssumption(0.30, 0.10, 0.45, "guess: Ada GPU, eager bf16"),
}


@dataclass(frozen=True)
class OverheadPrior:
    s_per_layer_pass: float
    why: str


# Read off one measured GPU run of a small model (LoRA on all 7 projections, bf16, short pairs), whose step is far
# above its FLOP term: tens of eager ops per adapted layer forward at tens of us each, plus TRL's per-step logging
# syncs, so the overhead is per layer and pass. One point, added after that run (its own predictions.json
# predates it). CPU steps of the same model are FLOP-bound.
OVERHEAD_PRIORS: dict[str, OverheadPrior] = {
    "cpu": OverheadPrior(0.0, "CPU steps measured FLOP-bound"),
}
GPU_OVERHEAD = OverheadPrior(3.3e-3, "measured: SmolLM2-135M LoRA-DPO on an H200, 0.31 s/step at 30 layers x 3 "
                                     "passes (one point)")

# Measured correction to the activation term: on the tiny-cpu run (SmolLM2-135M, fp32, LoRA r=16 with dropout
# on all 7 projections, 8 sequences x ~60 tokens) the resident peak exceeded weights + runtime + LoRA state by
# 1.77 GiB, 3.2x the 34-bytes-per-hidden estimate: LoRA dropout keeps a copy of each adapted input, SwiGLU saves
# 4 intermediates of width 1536, and the held-out margin pass materialises fp32 logits. One point, CPU only.
ACTIVATION_FACTOR = 3.2
ACCURACY_PLATEAU = 0.75
ACCURACY_INTERVAL = (0.45, 0.90)


@dataclass(frozen=True)
class DpoPrediction:
    hardware: str
    n_params: int
    lora_params: int
    steps: int
    pairs_per_step: int
    mean_sequence_tokens: float
    forward_passes_per_step: float
    flops_per_step: float
    assumed_mfu: float
    mfu_why: str
    overhead_s: float                  # layers x passes x the dispatch prior
    step_s: float
    step_s_low: float
    step_s_high: float
    train_s: float
    peak_memory_gib: float
    initial_loss: float | None         # None: ORPO's starting loss depends on the model's NLL
    epochs: float
    heldout_reward_accuracy: float
    heldout_reward_accuracy_low: float
    heldout_reward_accuracy_high: float


def forward_passes(cfg: DpoConfig, uses_reference: bool) -> float:
    ref = uses_reference and not cfg.train.precompute_ref_logprobs
    return 2.0 + float(ref) + float(cfg.train.gradient_checkpointing)


def memory_bytes(cfg: DpoConfig, baseline_bytes: int, lora_params: int, bytes_per_param: int, hidden: int,
                 layers: int, tokens_per_micro: float) -> float:
    """baseline + LoRA state + activations: ~34 bytes x hidden per token per layer at 16-bit (Korthikanti et al.
    2022, without the attention-score term that fused SDPA does not store; x2 for fp32) x ACTIVATION_FACTOR."""
    act_per_token_layer = 34 * hidden * (bytes_per_param / 2)
    keep_layers = 1 if cfg.train.gradient_checkpointing else layers
    return baseline_bytes + lora_params * 16 + ACTIVATION_FACTOR * act_per_token_layer * tokens_per_micro * keep_layers


def initial_loss(cfg: DpoConfig) -> float | None:
    return {"dpo": math.log(2.0), "ipo": (1.0 / (2.0 * cfg.train.beta)) ** 2}.get(cfg.train.loss)


def heldout_accuracy(epochs: float) -> tuple[float, float, float]:
    acc = 0.5 + (ACCURACY_PLATEAU - 0.5) * (1.0 - math.exp(-epochs))
    return acc, ACCURACY_INTERVAL[0], max(acc, ACCURACY_INTERVAL[1])


@dataclass(frozen=True)
class ModelShape:
    n_params: int
    lora_params: int
    hidden: int
    layers: int
    bytes_per_param: int
    memory_in_use_bytes: int     # read just before the prediction: weights, runtime, allocator caches


def predict(cfg: DpoConfig, shape: ModelShape, mean_sequence_tokens: float, n_train_pairs: int,
            device_type: str, uses_reference: bool) -> DpoPrediction:
    hw: Hardware = resolve_hardware(cfg.run.gpu, device_type)
    prior = MFU_PRIORS.get(hw.key, MFU_PRIORS["h200"])
    pairs_per_step = cfg.train.batch_size * cfg.train.grad_accum
    steps = cfg.train.max_steps or math.ceil(cfg.train.num_epochs * n_train_pairs / pairs_per_step)
    passes = forward_passes(cfg, uses_reference)
    flops = 2.0 * shape.n_params * 2 * pairs_per_step * mean_sequence_tokens * passes
    overhead = shape.layers * passes * OVERHEAD_PRIORS.get(hw.key, GPU_OVERHEAD).s_per_layer_pass
    step_s = flops / (prior.mfu * hw.bf16_flops) + overhead
    tokens_micro = 2 * cfg.train.batch_size * mean_sequence_tokens
    mem = memory_bytes(cfg, shape.memory_in_use_bytes, shape.lora_params, shape.bytes_per_param, shape.hidden,
                       shape.layers, tokens_micro)
    epochs = steps * pairs_per_step / max(n_train_pairs, 1)
    acc, lo, hi = heldout_accuracy(epochs)
    return DpoPrediction(hw.key, shape.n_params, shape.lora_params, steps, pairs_per_step, mean_sequence_tokens,
                         passes, flops, prior.mfu, prior.why, overhead, step_s,
                         flops / (prior.mfu_high * hw.bf16_flops) + overhead / 2,
                         flops / (prior.mfu_low * hw.bf16_flops) + overhead * 2, step_s * steps, mem / GIB, initial_loss(cfg),
                         epochs, acc, lo, hi)


def write_predictions(rd: RunDir, prediction: DpoPrediction) -> str:
    return rd.write_predictions({"job": "dpo", **asdict(prediction)})
