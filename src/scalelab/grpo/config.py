"""The GRPO job's typed config: model, data, rollout, loss, optim, train, eval, predict and run sections.

Defaults describe a tiny CPU run; `configs/grpo/*.toml` hold the named experiments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from scalelab.core.config import ConfigError, load_config, param, section
from scalelab.grpo.capabilities import capabilities


def generated_prompts(prompts_per_step: int, oversample: float) -> int:
    """ceil(P x oversample); the small epsilon keeps 32 x 1.5 at 48 in floating point, never 49."""
    return math.ceil(prompts_per_step * oversample - 1e-9)

@dataclass
class LoraConfig:
    enabled: bool = param(True, "train LoRA adapters (peft) instead of every weight; the reference model is then "
                                "the base with adapters disabled, so no second copy is held")
    r: int = param(16, "LoRA rank (Hu et al. 2021)", ge=1)
    alpha: float = param(32.0, "LoRA scale numerator: the update is (alpha / r) * B @ A", gt=0.0)
    dropout: float = param(0.0, "dropout on the LoRA input; 0 keeps generation and training on one policy",
                           ge=0.0, le=0.5)
    target_modules: list[str] = param(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                      "module names that get adapters (every linear of a Llama/Qwen2 block)")


@dataclass
class ModelConfig:
    name: str = param("smollm2-135m-instruct", "registry name (`scalelab models list`), HF hub id or local "
                                               "folder (core.models)")
    dtype: Literal["auto", "float32", "bfloat16"] = param("auto", "weights dtype; auto = bf16 on cuda, fp32 on cpu")
    cache_dir: str = param("", "download/conversion cache for hub models; '' = the loader's default")
    lora: LoraConfig = section(LoraConfig)


@dataclass
class CurriculumConfig:
    levels: Any = param([], "easier stages before the target task, in order: each a table of task_options merged "
                            "over data.task_options, e.g. [{digits = 1}] before 2-digit sums; [] = no curriculum. "
                            "The last stage is always the target (data.task_options), which eval also uses")
    promote_at: float = param(0.8, "promote to the next stage when the rolling train accuracy reaches this",
                              gt=0.0, le=1.0)
    window: int = param(4, "steps the rolling accuracy averages; a stage lasts at least this long", ge=1)
    metric: str = param("reward/correctness", "per-step metric the rolling accuracy averages (a logged key)")

    def validate(self) -> None:
        if not isinstance(self.levels, list) or not all(isinstance(v, dict) for v in self.levels):
            raise ConfigError(f"config field 'data.curriculum.levels': expected a list of tables of task options, "
                              f"got {self.levels!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.levels)


@dataclass
class DataConfig:
    task: str = param("arithmetic", "verifiable task name (evals.tasks.get_task)")
    task_options: Any = param({}, "options of the task, passed as get_task(task, **options), e.g. "
                                  "{digits = 1, operations = '+'} for arithmetic")
    split: str = param("train", "split the prompts come from")
    source: str = param("", "data source for the task ('' = its default: offline/embedded)")
    limit: int = param(0, "use at most this many examples; 0 = all", ge=0)
    prompts_per_step: int = param(4, "distinct prompts per optimizer step (P); sequences per step = P * group_size",
                                  ge=1)
    oversample: float = param(1.0, "roll out ceil(P * oversample) prompts' groups and train on P of them, the groups "
                                   "whose rewards differ first (DAPO's dynamic sampling, Yu et al. 2025, in one "
                                   "pass: grpo/dynsample.py); 1 = no choice. One process only", ge=1.0)
    rewards: list[str] = param(["correctness"], "reward components by registry name (evals.rewards)")
    reward_weights: list[float] = param([], "weight of each component in the scalar reward; [] = all 1.0")
    reward_options: Any = param({}, "parameters per reward component, get_reward(name, **options[name]), e.g. "
                                    "{length_aware = {exploit = 'length'}} for the deliberately hackable reward")
    curriculum: CurriculumConfig = section(CurriculumConfig)

    def validate(self) -> None:
        if not isinstance(self.task_options, dict):
            raise ConfigError(f"config field 'data.task_options': expected a table of options, "
                              f"got {self.task_options!r}")
        if not isinstance(self.reward_options, dict) or not all(
                isinstance(v, dict) for v in self.reward_options.values()):
            raise ConfigError(f"config field 'data.reward_options': expected a table of tables (reward name -> "
                              f"its parameters), got {self.reward_options!r}")
        unknown = sorted(set(self.reward_options) - set(self.rewards))
        if unknown:
            raise ConfigError(f"config field 'data.reward_options': {unknown[0]!r} is not in data.rewards "
                              f"{self.rewards}")
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"config field 'data.reward_weights': {len(self.reward_weights)} weights for "
                              f"{len(self.rewards)} rewards {self.rewards}")
        if not self.rewards:
            raise ConfigError("config field 'data.rewards': needs at least one reward component")


def captured_size_below(size: int) -> int:
    """The largest CUDA-graph size vLLM's default capture list holds at or below `size` (config/vllm.py:
    1, 2, 4, then every 8 up to 248, then every 16 from 256)."""
    if size >= 256:
        return size - size % 16
    if size >= 8:
        return size - size % 8
    return max(s for s in (1, 2, 4) if s <= size)


@dataclass
class ServerConfig:
    python: str = param(".venv-vllm/bin/python", "python of the venv that runs the vLLM server")
    tensor_parallel: int = param(1, "server tensor-parallel size", ge=1)
    gpus: str = param("", "CUDA_VISIBLE_DEVICES of the server, e.g. '1,2,3' with the trainer on GPU 0; "
                          "'' = inherit")
    port: int = param(0, "server port; 0 = a free port", ge=0)
    max_model_len: int = param(1024, "server context length (prompt + completion)", ge=16)
    gpu_memory_utilization: float = param(0.3, "vLLM's share of GPU memory (colocated or server)", gt=0.0, le=1.0)
    cpu_kvcache_gib: int = param(1, "VLLM_CPU_KVCACHE_SPACE on a CPU server", ge=1)
    ready_timeout_s: float = param(600.0, "wait this long for the server to answer /health", gt=0.0)
    request_timeout_s: float = param(600.0, "one generate request (all prompts of a step)", gt=0.0)
    full_sync: Literal["reload_rpc", "restart"] = param(
        "reload_rpc", "full-weight sync into a server: in place through vLLM's dev-mode /collective_rpc "
                      "reload_weights, or a relaunch on the new folder (measures the restart cost)")
    enforce_eager: bool = param(False, "no CUDA graphs / torch.compile in vLLM (faster start, slower decode)")
    max_num_seqs: int = param(
        0, "most sequences vLLM decodes at once (LLM kwarg, server --max-num-seqs); a step's P*G sequences above "
           "it decode in waves. 0 = vLLM's default: 1024 for the LLM class on a >= 70 GB GPU, 256 on smaller",
        ge=0)
    max_cudagraph_capture_size: int = param(
        0, "largest decode batch vLLM captures a CUDA graph for (compilation_config, server "
           "--max-cudagraph-capture-size); larger batches decode eagerly. 0 = vLLM's default min(2 * max_num_seqs, "
           "512), so a step of more sequences than that decodes without graphs, paying a kernel launch per op "
           "on the host; setting it to the step's P*G keeps the whole batch on graphs (bench/gpu_grpo.sh "
           "variants measures both). Must be "
           "a size vLLM captures: 1, 2, 4, a multiple of 8 below 256, a multiple of 16 from 256", ge=0)
    engine_core: Literal["inprocess", "subprocess"] = param(
        "inprocess", "colocated engine: where vLLM's engine core (scheduler + model runner) runs. inprocess: in "
                     "the trainer's process, so every decode step's scheduling and output handling sit on the "
                     "trainer's thread between GPU steps, and weights load through apply_model; subprocess: "
                     "vLLM's own child process on the same GPU, which overlaps that CPU work with the GPU "
                     "(VLLM_ENABLE_V1_MULTIPROCESSING=1), and weights move as CUDA IPC handles, no copy")
    engines: int = param(
        1, "colocated engine: vllm.LLM instances sharing the GPU, each generating a contiguous share of a call's "
           "prompts (a prompt's n samples stay on one engine) with gpu_memory_utilization / engines of the GPU "
           "(its own copy of the weights, KV cache and CUDA graphs inside that share). vLLM V1 schedules every "
           "decode step in Python, one engine core per process, so with a small model and a large batch the "
           "host-side scheduler rather than the GPU can set the step time; N engines run N schedulers side by "
           "side. Needs engine_core='subprocess'; sub-engine k is seeded train.seed + k. 1 = one engine", ge=1)
    flat_logprobs: bool = param(
        True, "colocated engine: ask vLLM for FlatLogprobs (a few flat lists per sequence) instead of a dict and a "
              "Logprob object per generated token, built on the decode loop's thread since the engine core runs "
              "in-process; used when the installed vLLM's SamplingParams has the field, else the dict path")

    def validate(self) -> None:
        if self.engines > 1 and self.engine_core != "subprocess":
            raise ConfigError(f"config field 'rollout.server.engines': {self.engines} engines need "
                              "rollout.server.engine_core='subprocess', each engine's scheduler in a process of its "
                              f"own; with {self.engine_core!r} they would all schedule on this process's thread")
        size = self.max_cudagraph_capture_size
        if size and self.enforce_eager:
            raise ConfigError(f"config field 'rollout.server.max_cudagraph_capture_size': {size} needs CUDA graphs, "
                              "but rollout.server.enforce_eager=true captures none; set one of them to its default")
        if size and size not in (1, 2, 4) and size % (8 if size < 256 else 16):
            lower = captured_size_below(size)
            raise ConfigError(f"config field 'rollout.server.max_cudagraph_capture_size': vLLM captures no graph of "
                              f"size {size} (it would use {lower}); allowed: 1, 2, 4, a multiple of 8 below 256, "
                              f"a multiple of 16 from 256, or 0 for vLLM's default")


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm_server", "vllm_colocated"] = param(
        "hf", "rollout engine: the trainer's own HF generate, a vLLM OpenAI server, or vLLM in-process (GPU)")
    weight_sync: Literal["auto", "shared", "inplace", "safetensors", "lora_adapter", "nccl"] = param(
        "auto", "trainer -> engine sync: shared module (hf), in-place copy (hf/colocated), safetensors folder + "
                "reload (server), LoRA adapter load (server), NCCL broadcast into the server's workers (server on "
                "GPUs of its own); auto = shared/inplace/lora_adapter/safetensors by engine")
    group_size: int = param(8, "completions per prompt (G in GRPO, Shao et al. 2024)", ge=2)
    temperature: float = param(1.0, "sampling temperature; the policy in the loss is softmax(logits / T)", gt=0.0)
    top_p: float = param(1.0, "nucleus sampling; < 1 makes the sampled distribution differ from the loss's policy",
                         gt=0.0, le=1.0)
    max_new_tokens: int = param(64, "completion budget per sequence", ge=1)
    staleness: int = param(0, "rollouts used at step t come from the weights of step t-k (k=0: on-policy)", ge=0)
    server: ServerConfig = section(ServerConfig)


@dataclass
class LossConfig:
    clip_low: float = param(0.2, "PPO clip: ratio floor 1 - clip_low (Schulman et al. 2017)", ge=0.0, le=1.0)
    clip_high: float = param(0.2, "ratio ceiling 1 + clip_high; > clip_low is DAPO's clip-higher (Yu et al. 2025)",
                             ge=0.0)
    kl_coef: float = param(0.0, "beta of the k3 KL penalty to the reference (DeepSeekMath eq. 4)", ge=0.0)
    skip_zero_signal: bool = param(False, "leave groups whose rewards are all equal (advantage 0: no gradient "
                                          "at kl_coef 0) out of the reference pass, the update and the token "
                                          "normalizer; DAPO's dynamic-sampling filter (Yu et al. 2025) without "
                                          "the refill. KL, entropy and clip fraction are then over the kept groups")
    log_kl: bool = param(True, "run the reference pass on the sampled tokens every step even at kl_coef = 0, so "
                               "KL(pi || ref) (k3) is logged; costs one forward of the batch (the 'reference' "
                               "phase), and with full-weight training a frozen copy of the model")
    scale_rewards: Literal["group_std", "none"] = param(
        "group_std", "divide group-centred rewards by the group std (GRPO) or not (Dr. GRPO, Liu et al. 2025)")
    aggregation: Literal["token_mean", "seq_mean", "seq_sum_norm"] = param(
        "token_mean", "loss over tokens: mean over all tokens of the step (DAPO), mean of per-sequence means "
                      "(GRPO), or per-sequence sums / max_new_tokens (Dr. GRPO)")
    is_correction: bool = param(False, "multiply by the truncated IS weight min(pi_old / pi_behavior, is_cap) "
                                       "(V-trace truncation, Espeholt et al. 2018) for stale rollouts")
    is_cap: float = param(2.0, "truncation level C of the IS weight", gt=0.0)
    updates_per_batch: int = param(1, "optimizer steps on each rollout batch (mu in GRPO); > 1 needs pi_old",
                                   ge=1)


@dataclass
class OptimConfig:
    lr: float = param(1e-5, "AdamW learning rate", gt=0.0)
    warmup_steps: int = param(0, "linear warmup from 0 over this many optimizer steps, then constant", ge=0)
    weight_decay: float = param(0.0, "AdamW decay", ge=0.0)
    beta1: float = param(0.9, "AdamW beta1", ge=0.0, le=1.0)
    beta2: float = param(0.99, "AdamW beta2", ge=0.0, le=1.0)
    grad_clip: float = param(1.0, "clip global grad norm; 0 disables", ge=0.0)
    micro_batch_size: int = param(8, "sequences per forward/backward; the step's P*G sequences are accumulated",
                                  ge=1)
    bf16_autocast: bool = param(True, "with a bf16 base and fp32 LoRA adapters (peft's default), run the policy's "
                                      "forward passes under torch.autocast(bf16) with peft's input casting off: "
                                      "the adapters' matmuls then run in bf16 on the tensor cores instead of as "
                                      "fp32 GEMMs on copied activations; their weights, gradients and AdamW state "
                                      "stay fp32 (grpo.precision). No effect on an fp32 or fully trained model")
    compile_head: bool = param(True, "on a GPU, the LM head's two elementwise passes per chunk (log-sum-exp, "
                                     "target log-prob and entropy; the gradient) through torch.compile, fused "
                                     "into kernels that read the bf16 logits once instead of making fp32 copies "
                                     "(grpo.head); eager on the CPU")
    compile_layers: bool = param(False, "on a GPU, each decoder layer of the policy through torch.compile with "
                                        "dynamic shapes (one graph for every pass width), which fuses a layer's "
                                        "elementwise work (RMSNorm, rotary, the LoRA adapters' casts and scaled "
                                        "adds, SiLU * up, residual adds) into fewer kernels where the update is "
                                        "bound by kernel launches (grpo.layercompile). Compiles on the first pass "
                                        "and once more per setting (grad on/off, autocast, adapters on/off); a "
                                        "compiler failure warns and runs eagerly. Eager on the CPU")
    micro_batch_tokens: int = param(0, "when > 0: the step's sequences sorted by length into forward/backward "
                                       "passes of at most this many padded tokens (and micro_batch_size rows); "
                                       "0 = fixed slices of micro_batch_size in rollout order", ge=0)


@dataclass
class TrainConfig:
    max_steps: int = param(20, "optimizer steps (rollout batches x updates_per_batch)", ge=1)
    seed: int = param(0, "seed for init, prompt order and sampling")
    device: Literal["auto", "cpu", "cuda"] = param("auto", "auto = cuda when available")
    checkpoint_every: int = param(10, "atomic checkpoint every N steps (and at the end); 0 = end only", ge=0)
    resume: bool = param(True, "continue from the run folder's checkpoint when one exists")
    torch_threads: int = param(0, "intra-op CPU threads; 0 = torch's default (all cores). On a CPU shared with "
                                  "other jobs fewer threads avoid OpenMP workers spinning against each other", ge=0)
    gpu_sample_hz: float = param(20.0, "NVML utilization/memory samples per second (GPU only)", gt=0.0)
    budget_s: float = param(0.0, "stop after the step during which this launch's wall time passed budget_s, with a "
                                 "checkpoint, so a job of fixed length (a 10-minute GPU lease) ends cleanly and "
                                 "the same command resumes; 0 = no budget", ge=0.0)


@dataclass
class EvalConfig:
    split: str = param("test", "held-out split of data.task the policy is scored on; never the training split")
    limit: int = param(200, "held-out examples scored", ge=1)
    data_seed: int = param(0, "seed of the held-out examples and of eval sampling, fixed across training seeds so "
                              "every run of a study is scored on the same examples with the same base result")
    greedy: bool = param(True, "greedy pass@1: one temperature-0 completion per example")
    samples: int = param(0, "n sampled completions per example at eval.temperature for the unbiased pass@k "
                            "estimator (Chen et al. 2021); 0 = none", ge=0)
    temperature: float = param(1.0, "sampling temperature of the n samples", gt=0.0)
    max_new_tokens: int = param(0, "completion budget; 0 = rollout.max_new_tokens", ge=0)
    prompts_per_call: int = param(64, "prompts per engine.generate call", ge=1)
    at_end: bool = param(False, "score the base policy before step 0 and the trained one after the last step")
    every: int = param(0, "a held-out learning curve: greedy pass@1 on the first curve_limit held-out examples "
                          "every N optimizer steps and at step 0 (event heldout_curve); 0 = off", ge=0)
    curve_limit: int = param(500, "held-out examples of each curve point (the first of the eval.limit)", ge=1)
    bootstrap_resamples: int = param(10_000, "resamples of the paired bootstrap CI of trained - base", ge=100)
    confidence: float = param(0.95, "level of every confidence interval", gt=0.5, le=0.999)


@dataclass
class PredictConfig:
    decode_efficiency: float = param(0.5, "share of the roofline decode rate (weights read once per step at "
                                          "memory bandwidth, or peak FLOP/s) the engine reaches", gt=0.0, le=1.0)
    decode_step_overhead_ms: float = param(10.0, "fixed cost of one decode step (sampling, Python, launches); "
                                                 "dominates for small models", ge=0.0)
    train_mfu: float = param(0.1, "model FLOPs utilization assumed for the forward/backward passes", gt=0.0,
                             le=1.0)
    mean_length_frac: float = param(1.0, "expected completion length / max_new_tokens", gt=0.0, le=1.0)


@dataclass
class RunConfig:
    name: str = param("tiny-cpu", "run name: the folder is <out_dir>/<name>")
    out_dir: str = param("runs/grpo", "parent folder of run folders")
    gpu: str = param("auto", "hardware table key for predictions (auto = detect)")


@dataclass
class GrpoConfig:
    model: ModelConfig = section(ModelConfig)
    data: DataConfig = section(DataConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    loss: LossConfig = section(LossConfig)
    optim: OptimConfig = section(OptimConfig)
    train: TrainConfig = section(TrainConfig)
    eval: EvalConfig = section(EvalConfig)
    predict: PredictConfig = section(PredictConfig)
    run: RunConfig = section(RunConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    @property
    def sequences_per_step(self) -> int:
        return self.data.prompts_per_step * self.rollout.group_size

    @property
    def rollout_prompts_per_step(self) -> int:
        """Prompts a step rolls out: prompts_per_step, times data.oversample (grpo/dynsample.py)."""
        return generated_prompts(self.data.prompts_per_step, self.data.oversample)

    def validate(self) -> None:
        engine, sync = self.rollout.engine, self.rollout.weight_sync
        methods = capabilities(engine).sync_methods
        if sync != "auto" and sync not in methods:
            raise ConfigError(f"config field 'rollout.weight_sync': {sync!r} does not work with rollout.engine="
                              f"{engine!r}; allowed: 'auto', {', '.join(map(repr, methods))}")
        if self.rollout.weight_sync == "lora_adapter" and not self.model.lora.enabled:
            raise ConfigError("config field 'rollout.weight_sync': 'lora_adapter' needs model.lora.enabled=true")
        if sync == "nccl":
            self.validate_nccl()
        metric, logged = self.data.curriculum.metric, ["reward_mean", *(f"reward/{r}" for r in self.data.rewards)]
        if self.data.curriculum.enabled and metric not in logged:
            raise ConfigError(f"config field 'data.curriculum.metric': {metric!r} is not logged; allowed: "
                              f"{', '.join(map(repr, logged))}")
        if self.eval.split == self.data.split:
            raise ConfigError(f"config field 'eval.split': {self.eval.split!r} is the training split (data.split); "
                              "held-out scores need a split the policy never trained on")

    def validate_nccl(self) -> None:
        # Whether CUDA and vLLM are there is the trainer process's business: refused at engine build (ncclsync).
        if self.train.device == "cpu":
            raise ConfigError("config field 'rollout.weight_sync': 'nccl' broadcasts from the trainer's GPU, and "
                              "train.device='cpu' has none; allowed here: 'safetensors', 'lora_adapter'")
        if not self.rollout.server.gpus:
            raise ConfigError("config field 'rollout.server.gpus': weight_sync 'nccl' needs the server on GPUs of "
                              "its own (e.g. '1' with the trainer on GPU 0): NCCL puts one rank per GPU, and a "
                              "server that inherits the trainer's devices would share its first GPU")


def load_grpo_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> GrpoConfig:
    return load_config(GrpoConfig, path, overrides)
