"""The preference-tuning job's typed config: model, data, verifier sampling, LoRA, training, margins, hub, battery,
the sweep's runs, the rule that chooses among them, run.

Defaults describe the tiny CPU demo; `configs/dpo/*.toml` hold the named experiments.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from scalelab.core.config import ConfigError, load_config, param, section
from scalelab.core.tracking import check_trackers


@dataclass
class ModelConfig:
    name: str = param("smollm2-135m-instruct", "registry name (`scalelab models list`), HF hub id or local "
                                               "folder (core.models)")
    dtype: Literal["auto", "float32", "bfloat16"] = param("auto", "weights dtype; auto = bf16 on cuda, fp32 on cpu")
    device: Literal["auto", "cpu", "cuda"] = param("auto", "auto = cuda when available")
    cache_dir: str = param("", "where GGUF conversions are cached; '' = $SCALELAB_CACHE or ~/.cache/scalelab")
    trust_remote_code: bool = param(False, "allow model code from the hub (off: only transformers' own classes)")


@dataclass
class DataConfig:
    source: Literal["verifier", "ultrafeedback", "hh-rlhf", "pairs"] = param(
        "verifier", "verifier = sample + grade on an evals task; ultrafeedback / hh-rlhf = public sets; "
                    "pairs = our own jsonl (prompt/chosen/rejected message lists)")
    path: str = param("", "hub id or local file/folder; '' = the source's hub id (verifier: <run>/preferences.jsonl)")
    subset: str = param("", "hub data_dir, e.g. 'harmless-base' for Anthropic/hh-rlhf; '' = none")
    split: str = param("", "split to load; '' = the source's default (ultrafeedback: train_prefs, hh-rlhf: train)")
    max_pairs: int = param(0, "keep at most this many pairs before the validation split (seeded); 0 = all", ge=0)
    val_fraction: float = param(0.1, "share of prompts held out for validation (split by prompt)", ge=0.0, le=0.9)
    val_split: Literal["seeded", "hash"] = param(
        "seeded", "seeded = a seeded permutation of the prompts; hash = a question is held out when the sha256 of "
                  "its user turns falls below val_fraction: the same questions whatever the seed, order or size")
    strict: bool = param(True, "malformed rows are an error naming file and line; false = skip and count them")
    seed: int = param(0, "seed for subsampling and the validation split")


@dataclass
class VerifierConfig:
    task: str = param("arithmetic", "evals task whose verifier grades the samples (arithmetic, gsm8k, math500, ...)")
    task_options: Any = param({}, "options of the task, e.g. {digits = 2, operations = \"+-\"} (evals.tasks.get_task)")
    split: str = param("train", "task split the prompts come from")
    num_prompts: int = param(64, "prompts to sample from", ge=1)
    samples_per_prompt: int = param(4, "k answers sampled per prompt", ge=2)
    temperature: float = param(1.0, "sampling temperature: higher = more mixed right/wrong groups", gt=0.0)
    top_p: float = param(1.0, "nucleus sampling; 1 = off", gt=0.0, le=1.0)
    max_new_tokens: int = param(48, "tokens generated per answer", ge=1)
    batch_prompts: int = param(16, "prompts per generate call (each expands to k sequences)", ge=1)
    pairs_per_prompt: int = param(2, "most (correct, incorrect) pairs kept per informative prompt", ge=1)
    seed: int = param(0, "seed for prompt choice, sampling and pairing")
    reuse: bool = param(True, "reuse an existing preferences.jsonl whose manifest matches this config")
    sampler_url: str = param("", "'' = HF generate in the training process; else the base URL of an OpenAI-"
                                 "compatible vLLM server serving the base model (vLLM on the GPU: n = k samples "
                                 "per request)")
    sampler_model: str = param("", "model name the server serves it under; '' = model.name")
    concurrent_batches: int = param(1, "server sampler: batch requests in flight at once, so the server's "
                                       "continuous batching has work while one request waits for its longest "
                                       "answer; not part of the set's manifest key. HF generate: ignored (one "
                                       "batch at a time)", ge=1)
    request_seeds: bool = param(True, "server sampler: each request carries its batch's seed, so a rerun draws "
                                      "the same samples; false = the server's own seed only (vLLM draws every "
                                      "seeded sequence's noise with its own generator, row by row, which can "
                                      "dominate a step at large batches; the samples then depend on the "
                                      "server's batching and a rerun or resume draws others)")

    def validate(self) -> None:
        if not isinstance(self.task_options, dict):
            raise ConfigError(f"config field 'verifier.task_options': got {self.task_options!r}; expected a table")


@dataclass
class LoraConfig:
    rank: int = param(16, "LoRA rank r (Hu et al. 2021, sec. 4)", ge=1)
    alpha: float = param(32.0, "LoRA scale numerator: update = (alpha / r) * B A", gt=0.0)
    dropout: float = param(0.05, "dropout on the LoRA input", ge=0.0, le=0.9)
    target_modules: list[str] = param(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                      "module names to adapt (never lm_head: TRL computes log-probs from its weight)")


@dataclass
class TrainConfig:
    loss: Literal["dpo", "ipo", "orpo"] = param("dpo", "dpo = sigmoid loss (Rafailov et al. 2023); ipo = squared "
                                                       "loss (Azar et al. 2023); orpo = odds ratio + SFT, no "
                                                       "reference (Hong et al. 2024)")
    beta: float = param(0.1, "DPO/IPO: KL strength beta (IPO's tau); ORPO: odds-ratio weight lambda", gt=0.0)
    learning_rate: float = param(5e-5, "AdamW peak lr on the LoRA weights", gt=0.0)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = param("cosine", "lr schedule")
    warmup_steps: int = param(0, "linear warmup steps", ge=0)
    max_steps: int = param(12, "optimizer steps; 0 = num_epochs over the train split", ge=0)
    num_epochs: float = param(1.0, "epochs when max_steps = 0", gt=0.0)
    batch_size: int = param(4, "pairs per device per micro-batch", ge=1)
    grad_accum: int = param(1, "micro-batches per optimizer step", ge=1)
    max_length: int = param(256, "prompt + response tokens kept per sequence (longer: truncated at the end)", ge=8)
    precompute_ref_logprobs: bool = param(False, "compute reference log-probs once before training (DPO/IPO "
                                                 "only): a step loses its reference forward, the same forward is "
                                                 "paid up front, so it pays from the second epoch on")
    gradient_checkpointing: bool = param(False, "recompute activations in backward: less memory, ~30% slower")
    packing: Literal["none", "padding_free", "shared_prompt"] = param(
        "none", "DPO/IPO forward layout. none = TRL's: each micro-batch padded to its longest sequence; "
                "padding_free = the sequences packed into one row, attention per sequence (sdpa), so no compute "
                "goes to pad tokens; shared_prompt = padding_free and each pair's prompt run once, chosen and "
                "rejected attending to it (prefix sharing, Wang & Hegde 2024). Same loss, fewer tokens computed")
    logging_steps: int = param(1, "trainer log line every N steps", ge=1)
    save_steps: int = param(0, "checkpoint every N steps for resume; 0 = only at the end", ge=0)
    resume: bool = param(True, "continue from the last checkpoint in the run folder when one exists")
    seed: int = param(0, "seed for LoRA init and batch order")

    def validate(self) -> None:
        if self.precompute_ref_logprobs and self.loss == "orpo":
            raise ConfigError("config field 'train.precompute_ref_logprobs': ORPO has no reference model; "
                              "set it to false or choose train.loss = 'dpo' or 'ipo'")
        if self.packing != "none" and self.loss == "orpo":
            raise ConfigError(f"config field 'train.packing': {self.packing!r} applies to DPO/IPO only; "
                              "set it to 'none' or choose train.loss = 'dpo' or 'ipo'")


@dataclass
class MarginsConfig:
    every_steps: int = param(4, "compute margins on the eval subset every N steps (and at start and end)", ge=1)
    eval_pairs: int = param(16, "fixed validation pairs used for margins", ge=1)
    bins: int = param(20, "histogram bins", ge=2)
    batch_pairs: int = param(8, "pairs per forward pass", ge=1)


@dataclass
class HubConfig:
    push: bool = param(False, "push the adapter to the HF Hub at the end (token from env HF_TOKEN only)")
    repo_id: str = param("", "hub repo, e.g. user/smollm2-dpo")
    private: bool = param(True, "create the repo as private")
    endpoint: str = param("", "'' = the Hub (huggingface.co); else the URL of a server speaking its API (a mirror)")

    def validate(self) -> None:
        if self.push and not self.repo_id:
            raise ConfigError("config field 'hub.repo_id': required when hub.push = true")


@dataclass
class RunConfig:
    name: str = param("tiny-cpu", "run name: the folder is <out_dir>/<name>")
    out_dir: str = param("runs/dpo", "parent folder of run folders")
    trackers: list[str] = param([], "extra metric sinks besides JSONL: 'wandb', 'tensorboard'")
    gpu: str = param("auto", "hardware table key for predictions (auto = detect)")

    def validate(self) -> None:
        check_trackers(self.trackers)


BATTERY_PARTS = ("mmlu", "truthfulqa", "own", "target", "mtbench")


@dataclass
class BatteryConfig:
    enabled: bool = param(False, "after train/sweep: evaluate base and base+adapter (dpo.battery), then REPORT.md")
    parts: list[str] = param(list(BATTERY_PARTS), "parts to run: mmlu (lm-eval, mmlu_fewshot shots), truthfulqa "
                                                  "(MC1 + MC2), own (own_tasks), target (the tuned task, held out), "
                                                  "mtbench")
    data_dir: str = param("", "folder with mmlu/, truthfulqa/, mt_bench/; '' = ../shared/data "
                              "($SCALELAB_SHARED_DATA)")
    source: Literal["local", "hub"] = param("local", "local = our lm-eval YAMLs on data_dir's copies; "
                                                     "hub = lm-eval's own tasks, data from the hub")
    mmlu_limit: int = param(0, "MMLU questions per subject (lm-eval limits each of the 57); 0 = all 14,042", ge=0)
    mmlu_subset: int = param(0, "N > 0: the fixed stratified subset of N MMLU test items (evals.mmlu_subset: the "
                                "same items for every run, by a hash of each item); 0 = mmlu_limit decides", ge=0)
    mmlu_base_full: bool = param(False, "with mmlu_subset: the base side runs all 14,042 items (once per sweep), "
                                        "and each subset row pairs on the subset's items of it "
                                        "(dpo.mmlu_pairing), so a run measured in full later compares with the "
                                        "same base record; without mmlu_subset it changes nothing")
    mmlu_fewshot: int = param(5, "MMLU exemplars per prompt: 5 is the reported setting (Hendrycks et al. 2021); "
                                 "0 makes prompts ~6x shorter, for CPU demos", ge=0)
    truthfulqa_limit: int = param(0, "TruthfulQA questions, MC1 and MC2 each; 0 = all", ge=0)
    lm_eval_batch_size: int = param(8, "lm-eval requests per forward pass", ge=1)
    lm_eval_request_cache: bool = param(True, "build lm-eval's requests (and their token ids) once per sweep, in "
                                              "<sweep>/battery-base/lm-eval-requests/, for both sides of every "
                                              "run; same results, minutes less per lm-eval part (source local)")
    own_tasks: list[str] = param(["toolcall_schema", "toolcall_args", "ifeval_lite"],
                                 "own generation tasks with programmatic checkers (evals.tasks names)")
    own_n: int = param(64, "test-split examples per own task", ge=1)
    target_task: str = param("", "task the run was tuned for; '' = verifier.task with verifier.task_options")
    target_split: str = param("test", "held-out split of the target task")
    target_n: int = param(200, "target examples", ge=1)
    mtbench_limit: int = param(0, "MT-Bench questions; 0 = all 80", ge=0)
    max_new_tokens: int = param(256, "greedy generation limit, own and target tasks", ge=1)
    mtbench_max_new_tokens: int = param(1024, "greedy generation limit per MT-Bench turn", ge=1)
    gen_batch_size: int = param(16, "prompts per generate call (left-padded, sorted by length); with "
                                    "generation_backend 'vllm', requests in flight", ge=1)
    generation_backend: Literal["hf", "vllm"] = param(
        "hf", "what decodes own, target and MT-Bench: hf = transformers generate on base + adapter merged; vllm = "
              "a vLLM server per side (dpo.generate_vllm; started by $SCALELAB_VLLM_PYTHON, else this python), "
              "continuously batched, the adapter served on vLLM's LoRA path so no merged copy is written; same "
              "prompts, limits and scoring, but its records are kept apart from hf's (greedy decoding may differ "
              "by numerics)")
    vllm_gpu_memory_utilization: float = param(
        0.0, "with generation_backend 'vllm': the server's share of GPU memory; 0 = vLLM's default (0.9), which "
             "leaves no room for a training run or another battery process on the same GPU. Not part of a "
             "record's spec: the share sizes the KV cache, not what greedy decoding returns", ge=0.0, le=1.0)
    judge_url: str = param("", "OpenAI-compatible base URL of the MT-Bench judge; '' = MT-Bench not measured")
    judge_model: str = param("", "judge model name; '' = MT-Bench not measured")
    judge_check: str = param("", "a judge_check.json (scalelab dpo judge-check); when set and it found the judge "
                                 "unable to rate GPT-4's reference answers above the base's, MT-Bench is 'not "
                                 "measured: judge too weak' and nothing is generated")
    judge_api_key_env: str = param("OPENAI_API_KEY", "environment variable holding the judge's key (read there only)")
    mtbench_max_drop: float = param(0.5, "evidence row: largest allowed drop of the mean MT-Bench score (1-10)", ge=0.0)
    dtype: Literal["", "auto", "float32", "bfloat16"] = param("", "'' = model.dtype")
    device: Literal["", "auto", "cpu", "cuda"] = param("", "'' = model.device")
    bootstrap_resamples: int = param(10_000, "paired-bootstrap resamples per comparison", ge=100)
    seed: int = param(0, "seed of the generated tasks' examples and of the bootstrap")

    def validate(self) -> None:
        bad = [p for p in self.parts if p not in BATTERY_PARTS]
        if bad or len(set(self.parts)) != len(self.parts):
            raise ConfigError(f"config field 'battery.parts': got {self.parts!r}; allowed: "
                              f"{', '.join(BATTERY_PARTS)}, each at most once")
        if self.mmlu_subset and (self.mmlu_limit or self.source != "local"):
            raise ConfigError("config field 'battery.mmlu_subset': needs battery.mmlu_limit = 0 and source = 'local'")
        if "own" in self.parts and not self.own_tasks:
            raise ConfigError("config field 'battery.own_tasks': empty while battery.parts has 'own'")
        if len(set(self.own_tasks)) != len(self.own_tasks):
            raise ConfigError(f"config field 'battery.own_tasks': {self.own_tasks!r} names a task twice")


@dataclass
class SweepConfig:
    dpo_betas: list[float] = param([0.05, 0.1, 0.3], "DPO runs of `dpo sweep` (without --beta/--loss): one per beta")
    ipo_taus: list[float] = param([], "IPO runs: one per tau (train.beta carries it; TRL divides IPO's log-ratios "
                                      "by the response length, so its target margin 1/(2 tau) is per token)")
    orpo_lambdas: list[float] = param([], "ORPO runs: one per odds-ratio weight lambda (train.beta carries it)")
    ipo_learning_rate: float = param(0.0, "the IPO runs' lr; 0 = train.learning_rate", ge=0.0)
    orpo_learning_rate: float = param(0.0, "the ORPO runs' lr; 0 = train.learning_rate (ORPO has no reference "
                                           "and an SFT term, so its papers train at their own lr)", ge=0.0)

    def validate(self) -> None:
        for name in ("dpo_betas", "ipo_taus", "orpo_lambdas"):
            values = getattr(self, name)
            if any(not isinstance(v, (int, float)) or v <= 0 for v in values) or len(set(values)) != len(values):
                raise ConfigError(f"config field 'sweep.{name}': got {values!r}; expected distinct numbers > 0")
        if not (self.dpo_betas or self.ipo_taus or self.orpo_lambdas):
            raise ConfigError("config fields 'sweep.dpo_betas', 'sweep.ipo_taus', 'sweep.orpo_lambdas': all empty")


@dataclass
class SelectionConfig:
    losses: list[str] = param(["dpo"], "runs the rule chooses among (by train.loss); the others are reported beside")
    tie_tolerance: float = param(0.02, "runs whose final held-out reward accuracy is within this of the best are "
                                       "tied", ge=0.0, le=1.0)
    tie_break: Literal["larger_beta", "smaller_beta"] = param(
        "larger_beta", "which tied run is chosen: larger_beta = the strongest pull toward the reference")
    plateau_window: float = param(0.25, "share of the last steps over which a curve must have stopped moving",
                                  gt=0.0, le=1.0)
    plateau_accuracy_tol: float = param(0.02, "held-out reward accuracy: at most this change over the window",
                                        ge=0.0)
    plateau_margin_rel_tol: float = param(0.1, "held-out margin mean: at most this relative change over the window",
                                          ge=0.0)

    def validate(self) -> None:
        bad = [x for x in self.losses if x not in ("dpo", "ipo", "orpo")]
        if bad or not self.losses:
            raise ConfigError(f"config field 'selection.losses': got {self.losses!r}; allowed: 'dpo', 'ipo', "
                              "'orpo', at least one")


@dataclass
class DpoConfig:
    model: ModelConfig = section(ModelConfig)
    data: DataConfig = section(DataConfig)
    verifier: VerifierConfig = section(VerifierConfig)
    lora: LoraConfig = section(LoraConfig)
    train: TrainConfig = section(TrainConfig)
    margins: MarginsConfig = section(MarginsConfig)
    hub: HubConfig = section(HubConfig)
    battery: BatteryConfig = section(BatteryConfig)
    sweep: SweepConfig = section(SweepConfig)
    selection: SelectionConfig = section(SelectionConfig)
    run: RunConfig = section(RunConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name


def load_dpo_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DpoConfig:
    return load_config(DpoConfig, path, overrides)
