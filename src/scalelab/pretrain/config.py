"""The pretraining job's typed config: model, data, optimizer, schedule, loop and run sections.

Defaults describe the tiny CPU demo model; `configs/pretrain/*.toml` hold the named experiments.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from scalelab.core.config import ConfigError, dump_toml, load_config, param, section
from scalelab.core.hardware import resolve_hardware
from scalelab.core.tracking import check_trackers

GPT2_VOCAB = 50257
GPT2_PADDED_VOCAB = 50304  # next multiple of 128: wider matmul tiles (Karpathy, nanoGPT/llm.c)


@dataclass
class ModelConfig:
    n_layer: int = param(4, "transformer blocks", ge=1)
    n_head: int = param(4, "attention heads per block", ge=1)
    n_embd: int = param(128, "residual stream width; must divide by n_head", ge=8)
    block_size: int = param(128, "context length T in tokens", ge=8)
    vocab_size: int = param(GPT2_VOCAB, "tokenizer vocabulary (GPT-2 BPE: 50257)", ge=2)
    padded_vocab_size: int = param(GPT2_PADDED_VOCAB, "embedding rows; >= vocab_size, extra rows never targeted", ge=2)
    bias: bool = param(True, "biases in Linear and LayerNorm, as GPT-2")
    dropout: float = param(0.0, "dropout on attention/MLP/residual; 0 for pretraining (nanoGPT)", ge=0.0, le=0.9)

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise ConfigError(f"config field 'model.n_embd': {self.n_embd} is not divisible by "
                              f"model.n_head={self.n_head}")
        if self.padded_vocab_size < self.vocab_size:
            raise ConfigError(f"config field 'model.padded_vocab_size': {self.padded_vocab_size} < "
                              f"model.vocab_size={self.vocab_size}")


@dataclass
class DataConfig:
    dir: str = param("data/pretrain/sharegpt", "folder with train_*.bin, val_*.bin and manifest.json")
    shuffle: bool = param(True, "train windows in a seeded random order per epoch (nanoGPT); false = llm.c's "
                                "sequential order. Contiguous batches of small B*T hold one or two documents "
                                "and give very noisy gradients")
    val_tokens: int = param(0, "tokens of the val split per evaluation; 0 = all "
                               "(FineWeb speedrun bar: 10485760)", ge=0)


@dataclass
class OptimConfig:
    lr: float = param(1e-3, "peak learning rate (GPT-2 124M: 6e-4, GPT-3 paper table 2.1)", gt=0.0)
    min_lr_ratio: float = param(0.1, "final lr / peak lr (Chinchilla: decay to ~10% of peak)", ge=0.0, le=1.0)
    weight_decay: float = param(0.1, "AdamW decay on 2-D weights only; biases/norms/embedding positions undecayed",
                                ge=0.0)
    beta1: float = param(0.9, "AdamW beta1", ge=0.0, le=1.0)
    beta2: float = param(0.95, "AdamW beta2 (0.95 for LLM stability, GPT-3)", ge=0.0, le=1.0)
    eps: float = param(1e-8, "AdamW epsilon", gt=0.0)
    grad_clip: float = param(1.0, "clip global grad norm to this; 0 disables", ge=0.0)
    muon_lr: float = param(0.02, "train.optimizer='muon': peak lr of the hidden matrices (the AdamW groups keep "
                                 "optim.lr; both follow the schedule). 0.02 is Jordan's reference Muon value, "
                                 "tuned on GPT-2 124M at a 0.5M-token batch (modded-nanogpt)", gt=0.0)
    muon_momentum: float = param(0.95, "Muon's Nesterov momentum (reference value; modded-nanogpt and Moonlight "
                                       "use 0.95); must be < 1", ge=0.0)
    muon_ns_steps: int = param(5, "Newton-Schulz iterations per Muon step: the reference 5 steps bring every "
                                  "singular value above ~3e-3 of the Frobenius norm into [0.68, 1.2] (muon.py); "
                                  "each extra one costs 3 matmuls per matrix", ge=1, le=20)
    muon_weight_decay: float = param(0.0, "Muon's decoupled decay (p *= 1 - lr*wd). 0 as modded-nanogpt's short "
                                          "runs; Liu et al. 2025 need ~0.1 (at AdamW-sized lr) for long runs", ge=0.0)

    def validate(self) -> None:
        if self.muon_momentum >= 1.0:
            raise ConfigError(f"config field 'optim.muon_momentum': {self.muon_momentum} must be < 1 (at 1 the "
                              "momentum buffer never forgets and grows without bound)")


@dataclass
class ScheduleConfig:
    kind: Literal["cosine", "wsd", "constant"] = param("cosine", "lr schedule after warmup")
    warmup_steps: int = param(20, "linear warmup steps from ~0 to peak lr", ge=0)
    cooldown_frac: float = param(0.2, "wsd: share of steps spent decaying linearly to min lr", ge=0.0, le=1.0)


@dataclass
class TrainConfig:
    max_steps: int = param(300, "optimizer steps", ge=1)
    micro_batch_size: int = param(16, "sequences per forward pass per process (B)", ge=1)
    total_batch_tokens: int = param(0, "tokens per optimizer step over all processes; 0 = one micro-batch "
                                       "per process. grad_accum = total / (B * T * world)", ge=0)
    val_every: int = param(50, "evaluate on the val split every N steps (and at the end); 0 = end only", ge=0)
    log_every: int = param(1, "one log line every N steps", ge=1)
    checkpoint_every: int = param(100, "write an atomic checkpoint every N steps (and at the end); 0 = end only",
                                  ge=0)
    seed: int = param(1337, "seed for init and data order")
    device: Literal["auto", "cpu", "cuda"] = param("auto", "auto = cuda when available")
    dtype: Literal["auto", "float32", "bfloat16"] = param("auto", "autocast dtype; auto = bf16 on cuda, fp32 on cpu")
    residual_dtype: Literal["float32", "compute"] = param(
        "float32", "the residual stream and the LayerNorm outputs between blocks: float32, as autocast leaves them "
                   "(fp32 embeddings; each add promotes; LayerNorm runs in fp32), or the compute dtype, as llm.c "
                   "trains GPT-2 in bf16: half the bytes of every residual add, LayerNorm and their gradients, and "
                   "of the activations saved for backward; LayerNorm's math stays fp32 inside the kernel")
    compile: bool = param(False, "torch.compile the model")
    compile_scope: Literal["model", "blocks"] = param("model", "compile the whole model, or each block and the "
                                                               "head apart (torchtitan; suits FSDP2)")
    compile_mode: Literal["default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"] = param(
        "default", "torch.compile mode: autotuned Triton matmul/attention choices, and CUDA graphs against "
                   "per-kernel launch cost (max-autotune, reduce-overhead)")
    compile_multi_kernel: bool = param(False, "Inductor compiles each reduction both one-pass (persistent) and "
                                              "looped and keeps the faster, timed at its first call "
                                              "(triton.multi_kernel): one-pass rows up to 16k wide, e.g. a per-row "
                                              "FP8 amax over 3,072 GELU outputs")
    compile_tune_kernels: bool = param(False, "Inductor tunes each of its Triton pointwise/reduction kernels' "
                                              "block sizes and warps by coordinate descent at first call "
                                              "(coordinate_descent_tuning); GEMMs untouched, where max-autotune's "
                                              "Triton GEMM template refuses FP8 operands (torch 2.11). With the "
                                              "FP8 recipe on an H200 (torch 2.11) it gave non-finite gradients at "
                                              "step 0, which the trainer stops on")
    parallel: Literal["ddp", "fsdp2"] = param("ddp", "data-parallel wrapper when world size > 1")
    fp8: Literal["none", "lm_head", "blocks", "all"] = param(
        "none", "FP8 matmuls (e4m3 forward, e5m2 gradients, per-tensor scales): the output head only, every "
                "Linear but the head, or every Linear; under train.loss_chunks the chunked head follows it")
    fp8_fast_accum: bool = param(False, "train.fp8: the forward GEMMs use Hopper's fast FP8 accumulation "
                                        "(torch._scaled_mm use_fast_accum; gradients stay precise, as torchao)")
    fp8_scaling: Literal["tensor", "row"] = param(
        "tensor", "train.fp8 scales: one per tensor, all three GEMMs in FP8; or one per row (token, feature) with "
                  "the weight-gradient GEMM in bf16 (torchao's rowwise_with_gw_hp), whose amaxes fuse into the "
                  "kernels that produce each row. The chunked head keeps per-tensor scales")
    fp8_gelu_kernel: bool = param(False, "train.fp8_scaling='row': the MLP's GELU and its gradient each fused with "
                                         "their FP8 row cast in one Triton kernel (fp8_kernels.py; CUDA)")
    attention: Literal["auto", "cudnn", "flash", "efficient", "math"] = param(
        "auto", "SDPA kernel to use on CUDA; auto = PyTorch's choice")
    batch_prefetch: bool = param(True, "train batches through pinned host memory, the next one cut and queued while "
                                       "the GPU runs the current one (device_batches.py); false: pageable copies "
                                       "in turn, each waiting for the kernels queued before it")
    overfit_batch: bool = param(False, "sanity mode: train on the first batch only; loss must go to ~0")
    token_budget: int = param(0, "dry run: stop once this many tokens were trained on; 0 = no budget", ge=0)
    resume: bool = param(True, "continue from the run folder's checkpoint when one exists")
    optimizer: Literal["adamw", "muon"] = param("adamw", "adamw: AdamW on every parameter. muon: Muon on the "
                                                         "attention and MLP matrices, AdamW (optim.lr) on "
                                                         "embeddings/head/biases/gains (muon.py)")
    loss_chunks: int = param(0, "compute LM head + cross-entropy over this many row chunks with the gradient "
                                "formed in the forward, so the (B*T, vocab) logits never exist at once "
                                "(chunked_ce.py); 0 = off (one plain head matmul). Chunks of ~8k rows keep each "
                                "matmul large (8 at B=64, T=1024)", ge=0)
    loss_kernel: Literal["torch", "triton", "triton-e5m2"] = param(
        "torch", "train.loss_chunks: each chunk's softmax, loss and gradient as compiled torch ops, or in one Triton "
                 "kernel that reads the logits twice and writes the gradient over them (ce_kernel.py; CUDA); "
                 "triton-e5m2, for an FP8 head: the kernels write the gradient as e5m2, row-major and transposed, "
                 "for the two gradient GEMMs, so no bf16 gradient, cast or transposed copy is made")
    target_val_loss: float = param(0.0, "time-to-target runs: stop (and checkpoint) at the first evaluation with "
                                        "val loss <= this; 0 = off", ge=0.0)

    def validate(self) -> None:
        if self.residual_dtype == "compute" and self.dtype == "float32":
            raise ConfigError("config field 'train.residual_dtype': 'compute' keeps the residual stream in the "
                              "autocast dtype, and train.dtype='float32' has none; set train.dtype='bfloat16' "
                              "(or 'auto' on a GPU) or train.residual_dtype='float32'")
        if self.loss_kernel != "torch" and not self.loss_chunks:
            raise ConfigError(f"config field 'train.loss_kernel': {self.loss_kernel!r} computes the chunks of the "
                              "chunked loss; set train.loss_chunks > 0 (8 at B=64, T=1024) or "
                              "train.loss_kernel='torch'")
        if self.fp8_gelu_kernel and (self.fp8_scaling != "row" or self.fp8 not in ("blocks", "all")):
            raise ConfigError("config field 'train.fp8_gelu_kernel': it fuses GELU with per-row FP8 casts in the "
                              "blocks; set train.fp8='blocks' or 'all' and train.fp8_scaling='row'")
        if self.loss_kernel == "triton-e5m2" and self.fp8 not in ("lm_head", "all"):
            raise ConfigError("config field 'train.loss_kernel': 'triton-e5m2' writes the gradient of an FP8 head; "
                              f"train.fp8={self.fp8!r} keeps the head in bf16: set train.fp8='lm_head' or 'all', or "
                              "train.loss_kernel='triton'")
        if self.fp8_scaling == "row" and (self.fp8 == "none" or (self.fp8 == "lm_head" and self.loss_chunks)):
            raise ConfigError("config field 'train.fp8_scaling': 'row' applies to FP8Linear layers, and with "
                              f"train.fp8={self.fp8!r}" + (" and the chunked head" if self.loss_chunks else "")
                              + " there are none; set train.fp8='blocks' or 'all', or train.fp8_scaling='tensor'")


@dataclass
class RunConfig:
    name: str = param("tiny-cpu", "run name: the folder is <out_dir>/<name>")
    out_dir: str = param("runs/pretrain", "parent folder of run folders")
    trackers: list[str] = param([], "extra metric sinks besides JSONL: 'wandb', 'tensorboard'")
    gpu: str = param("auto", "hardware table key for predictions and cost (auto = detect)")
    price_per_gpu_hour: float = param(-1.0, "USD per GPU-hour for cost accounting; < 0 = hardware table default")

    def validate(self) -> None:
        check_trackers(self.trackers)


@dataclass
class PretrainConfig:
    model: ModelConfig = section(ModelConfig)
    data: DataConfig = section(DataConfig)
    optim: OptimConfig = section(OptimConfig)
    schedule: ScheduleConfig = section(ScheduleConfig)
    train: TrainConfig = section(TrainConfig)
    run: RunConfig = section(RunConfig)

    def validate(self) -> None:
        rows = self.train.micro_batch_size * self.model.block_size
        if self.train.loss_chunks > rows:
            raise ConfigError(f"config field 'train.loss_chunks': {self.train.loss_chunks} chunks of a micro-batch "
                              f"of only micro_batch_size*block_size = {rows} rows; use at most {rows}")

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def grad_accum(self, world_size: int) -> int:
        """Micro-steps per optimizer step so one step sees `total_batch_tokens` tokens."""
        per_micro = self.train.micro_batch_size * self.model.block_size * world_size
        total = self.train.total_batch_tokens or per_micro
        if total % per_micro:
            raise ConfigError(f"config field 'train.total_batch_tokens': {total} is not a multiple of "
                              f"micro_batch_size*block_size*world_size = {per_micro}")
        return total // per_micro


def load_pretrain_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> PretrainConfig:
    return load_config(PretrainConfig, path, overrides)


def save_config(cfg: PretrainConfig, path: str | Path) -> None:
    dump_toml(cfg, path)


def peak_flops(device, gpu_key: str = "auto") -> float:
    """Dense bf16 peak FLOP/s of one device from the hardware table, for MFU (PaLM appendix B)."""
    return resolve_hardware(gpu_key, getattr(device, "type", str(device))).bf16_flops
