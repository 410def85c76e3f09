"""LoRA-DPO throughput on one GPU: TRL's defaults against our recipe, same model, data order and seeds.

    python3 bench/dpo_throughput.py --out results/h200/dpo_throughput_qwen7b.json     # Qwen2.5-7B shape, cuda, bf16
    python3 bench/dpo_throughput.py --tiny --out /tmp/dpo_tiny.json                   # CPU smoke test, < 1 min
    python3 bench/dpo_throughput.py --model qwen2.5-coder-1.5b-instruct-q4km \
        --pairs /tmp/dpo-runs/gsm8k/preferences.jsonl --repeats 2 --out /tmp/dpo_throughput_real.json

--model takes real weights (a registry name of scalelab.core.models, resolved to its local HF folder, or an HF
folder), loaded as the dpo job loads them (bf16 on cuda, float32 on CPU); the LoRA shape stays the same. --pairs
takes the job's preference jsonl (PreferencePair records, read with scalelab.dpo.data.load_pairs); the first
batch_pairs x (warm-up + measured steps) pairs in file order go to both trainers as the job hands them over
(conversational rows that TRL renders with the model's chat template and truncates to max_length), and the
trainers' seeded sampler orders them. --repeats R runs every variant R times, alternating (see run_plan), and the
summary gives per-variant medians over the repeats and the ratio of medians ours / trl_default.

Each variant runs in a fresh subprocess (its own CUDA allocator peak and caches), trl_default first. Measured per
variant: wall time of every optimizer step (between consecutive step ends, CUDA synchronised, so logging and the
next batch's collation count), the DPO loss and reward margin of every step, peak memory (CUDA: max allocated over
the whole subprocess, model init and precompute included; CPU: peak RSS), and the tokens of each micro-batch three
ways: real (non-pad tokens of the chosen + rejected rows, TRL's `num_tokens`), padded (what TRL's
collator hands the model) and shared-prompt packed (what our shared_prompt forward computes).

    tokens/s (step)        real tokens of the measured steps / their wall time
    tokens/s (end-to-end)  the same with the reference precompute added: the precompute covers the whole data set,
                           i.e. all warm-up + measured steps (one epoch, each pair seen once: the worst case for
                           precomputing), and its time is charged pro rata to the measured steps

Variants (VARIANTS below): trl_default; ours = no activation recompute + shared-prompt packing, reference forward
in the step as TRL does it; ours_precompute adds the reference precompute; two ablations attribute the gain.

Data (default): synthetic preference pairs of random token ids; prompt length ~ U{64..1024}, chosen and rejected
lengths ~ U{32..1024} each, drawn independently (+1 EOS), each sequence truncated to 2048 tokens (TRL keep_start).
With --model and no --pairs the same random words go through the model's tokenizer (a few tokens per word).

Equal loss: every run of a variant against the first run of trl_default, within max(loss_atol, NOISE_FACTOR x the
loss noise floor of trl_default against its own reruns); the rule and loss_atol are printed before any run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# ---------------------------------------------------------------------------------------------
# settings and variants


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


SHAPES = {"qwen2.5-7b": Shape(3584, 28, 28, 4, 18944, 152064),   # Qwen/Qwen2.5-7B config.json
          "tiny": Shape(64, 2, 4, 2, 128, 512)}


@dataclass(frozen=True)
class Settings:
    shape: str = "qwen2.5-7b"
    device: str = "cuda"
    max_length: int = 2048
    batch_pairs: int = 4
    warmup_steps: int = 2
    measured_steps: int = 8
    learning_rate: float = 2e-4          # LoRA-typical; high enough that the loss moves off ln 2 within the run
    lora_rank: int = 16
    seed: int = 0
    prompt_tokens: tuple[int, int] = (64, 1024)
    response_tokens: tuple[int, int] = (32, 1024)
    # bf16: the packed and padded layouts round differently in the backward's reductions and Adam's normalisation
    # carries that into the next steps (a 4-layer bf16 model at 10x this lr drifts by 1.5e-3 in 4 steps); the
    # forward itself is compared directly in logps_check
    loss_atol: float = 1e-2
    model_folder: str = ""               # real weights: a local HF folder ('' = random weights of `shape`)
    pairs_file: str = ""                 # real pairs: a PreferencePair jsonl ('' = synthetic)

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measured_steps


TINY = Settings(shape="tiny", device="cpu", max_length=128, batch_pairs=2, warmup_steps=1, measured_steps=3,
                learning_rate=1e-2, lora_rank=8, prompt_tokens=(8, 64), response_tokens=(4, 64), loss_atol=1e-4)


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    recipe: dict = field(default_factory=dict)   # our TrainConfig overrides; {} with trl=True
    trl: bool = False


# Measured on an H200 (results/h200/dpo_throughput_qwen7b.json): dropping the activation recompute is the win
# (~1.45x); packing computes ~30% fewer tokens but its per-sequence attention calls cost as much as it saves at
# batch 4, so the recipe keeps TRL's padded layout and packing stays as ablations.
OURS = {"gradient_checkpointing": False, "packing": "none", "precompute_ref_logprobs": False}
VARIANTS = {v.name: v for v in [
    Variant("trl_default", "TRL DPOTrainer, DPOConfig with only the shared settings", trl=True),
    Variant("ours", "our recipe: no activation recompute, TRL's padded forward", OURS),
    Variant("trl_default_repeat", "trl_default again in a fresh process: the run-to-run noise floor of the loss",
            trl=True),
    Variant("ours_precompute", "our recipe + reference log-probs precomputed before training",
            {**OURS, "precompute_ref_logprobs": True}),
    Variant("ours_padding_free", "ablation: padding-free packing (prompt run twice), no activation recompute",
            {**OURS, "packing": "padding_free"}),
    Variant("ours_shared_prompt", "ablation: shared-prompt packing, no activation recompute",
            {**OURS, "packing": "shared_prompt"}),
]}
REQUIRED = ("trl_default", "ours", "trl_default_repeat")
SPEEDUP_GOAL = 1.3    # ours / trl_default, ratio of median step tokens/s


@dataclass(frozen=True)
class TrlSwitch:
    trl_field: str          # the DPOConfig field a TRL user sets for the same change; '' = TRL has none
    trl_value: object = None
    note: str = ""


# What each of our recipe options is in TRL 1.16's DPOConfig, so the summary can say which part of a speed-up a
# TRL user gets by flipping a switch and which part is ours alone. A field missing from the installed DPOConfig
# (read from trl_default's recorded arguments) is reported as such rather than trusted.
TRL_EQUIVALENT = {
    ("gradient_checkpointing", False): TrlSwitch("gradient_checkpointing", False,
                                                 "TRL's DPOConfig turns activation recompute on by default"),
    ("gradient_checkpointing", True): TrlSwitch("gradient_checkpointing", True),
    ("precompute_ref_logprobs", False): TrlSwitch("precompute_ref_log_probs", False),
    ("precompute_ref_logprobs", True): TrlSwitch(
        "precompute_ref_log_probs", True, "same log-probs; ours keeps them in memory and skips TRL's sha256 of "
        "every weight (its disk-cache key)"),
    ("packing", "none"): TrlSwitch("padding_free", False),
    ("packing", "padding_free"): TrlSwitch(
        "padding_free", True, "TRL 1.16 documents padding_free as temporarily unavailable (it warns and pads)"),
    ("packing", "shared_prompt"): TrlSwitch("", None, "not in TRL: the prompt runs once per pair "
                                                      "(scalelab.dpo.packing)"),
}


@dataclass(frozen=True)
class ModelSource:
    """Where real weights came from: what was asked for, the folder opened, and hashes that pin it."""
    name: str
    folder: str
    config_sha256: str
    registry_sha256: str = ""    # the registry's pinned GGUF sha256 of a registry name; '' = none


@dataclass(frozen=True)
class PairsSource:
    path: str
    sha256: str
    count: int                   # pairs in the file
    used: int                    # the first `used` of them, in file order
ENV_RECORDED = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "TQDM_DISABLE", "NCCL_NVLS_ENABLE", "PYTHONPATH")


@dataclass(frozen=True)
class VariantResult:
    name: str
    ok: bool
    error: str = ""
    repeat: int = 0                           # which of the --repeats runs of this variant
    wall_s: float = 0.0                       # whole subprocess
    setup_s: float = 0.0                      # model + trainer construction, precompute included
    ref_precompute_s: float = 0.0
    step_s: list = field(default_factory=list)
    real_tokens: list = field(default_factory=list)      # per step
    padded_tokens: list = field(default_factory=list)    # per step
    shared_tokens: list = field(default_factory=list)    # per step
    losses: list = field(default_factory=list)
    margins: list = field(default_factory=list)
    peak_memory_gib: float = 0.0
    logps_check: dict = field(default_factory=dict)
    trainer_args: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# data and model (child process)


def word_tokenizer(vocab: int):
    """Whitespace word-level tokenizer whose word 'w<i>' is token id i: any id sequence round-trips exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<eos>", "<unk>"]
    words = {s: i for i, s in enumerate(specials)} | {f"w{i}": i for i in range(len(specials), vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def synthetic_rows(s: Settings, vocab: int) -> list[dict]:
    """Text preference pairs (TRL's standard format) of uniform random words; lengths as in the module doc."""
    import numpy as np
    rng = np.random.default_rng(s.seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(f"w{i}" for i in rng.integers(3, vocab, size=int(rng.integers(lo, hi + 1))))

    return [{"prompt": words(*s.prompt_tokens), "chosen": " " + words(*s.response_tokens),
             "rejected": " " + words(*s.response_tokens)} for _ in range(s.total_steps * s.batch_pairs)]


def pair_rows(path: str, needed: int) -> list[dict]:
    """The first `needed` pairs of a PreferencePair jsonl in file order, as the dpo job hands them to its trainer
    (PreferencePair.to_trl: message lists, rendered by TRL with the tokenizer's chat template). The parent's
    pairs_source has checked the file holds that many before any variant runs."""
    from scalelab.dpo.data import load_pairs
    return [p.to_trl() for p in load_pairs("pairs", path).pairs[:needed]]


def bench_rows(s: Settings) -> list[dict]:
    if s.pairs_file:
        return pair_rows(s.pairs_file, s.total_steps * s.batch_pairs)
    return synthetic_rows(s, SHAPES[s.shape].vocab)


def load_model(s: Settings):
    """(model, tokenizer): real weights loaded as the dpo job loads them, or the random shape and word tokenizer."""
    if s.model_folder:
        from scalelab.core.hfmodel import load_causal_lm
        return load_causal_lm(s.model_folder, "auto", s.device)  # auto: bf16 on cuda, float32 on CPU
    return build_model(s), word_tokenizer(SHAPES[s.shape].vocab)


def build_model(s: Settings):
    """Random-weight Qwen2 of the given shape, initialised directly on the device in its training dtype."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    sh = SHAPES[s.shape]
    cfg = Qwen2Config(vocab_size=sh.vocab, hidden_size=sh.hidden, num_hidden_layers=sh.layers,
                      num_attention_heads=sh.heads, num_key_value_heads=sh.kv_heads,
                      intermediate_size=sh.intermediate, max_position_embeddings=32768, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    dtype = torch.bfloat16 if s.device == "cuda" else torch.float32
    torch.manual_seed(s.seed)
    with torch.device(s.device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")


# ---------------------------------------------------------------------------------------------
# trainers (child process)


def dpo_settings(s: Settings, recipe: dict):
    """Our DpoConfig for the bench: the settings both variants share, then the recipe's options."""
    from scalelab.dpo.config import load_dpo_config
    shared = {"train.batch_size": s.batch_pairs, "train.max_length": s.max_length,
              "train.learning_rate": s.learning_rate, "train.lr_scheduler": "linear", "train.warmup_steps": 0,
              "train.max_steps": s.total_steps, "train.seed": s.seed, "train.logging_steps": 1,
              "lora.rank": s.lora_rank, "lora.alpha": 2.0 * s.lora_rank, "lora.dropout": 0.0}
    items = shared | {f"train.{k}": v for k, v in recipe.items()}
    return load_dpo_config(None, [f"{k}={json.dumps(v)}" for k, v in items.items()])


def build_trainer(v: Variant, s: Settings, model, tokenizer, rows: list[dict], out_dir: str):
    from scalelab.dpo.train import TrainerInputs, _dataset, build_trainer as build_ours, lora_config
    cfg = dpo_settings(s, v.recipe)
    if not v.trl:
        return build_ours(TrainerInputs(model, tokenizer, rows, cfg, Path(out_dir)))
    from trl import DPOConfig, DPOTrainer
    args = DPOConfig(output_dir=out_dir, bf16=s.device == "cuda", use_cpu=s.device == "cpu",
                     per_device_train_batch_size=s.batch_pairs, max_length=s.max_length,
                     learning_rate=s.learning_rate, max_steps=s.total_steps, seed=s.seed, logging_steps=1,
                     report_to="none")
    return DPOTrainer(model=model, args=args, train_dataset=_dataset(rows), processing_class=tokenizer,
                      peft_config=lora_config(cfg))


class BatchRecorder:
    """Wraps the trainer's collator: per micro-batch, the padded and the shared-prompt packed token counts."""

    def __init__(self, collate):
        self.collate, self.padded, self.shared = collate, [], []

    def __call__(self, examples):
        from scalelab.dpo.packing import batch_plan
        batch = self.collate(examples)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        labels = ids.masked_fill(batch["completion_mask"] == 0, -100)
        self.padded.append(ids.numel())
        self.shared.append(batch_plan(ids, mask, labels, share_prompt=True).n_tokens)
        return batch


def step_clock(device: str):
    """A callback with the time of train start and of every step end, the device synchronised first."""
    import torch
    from transformers import TrainerCallback

    def now() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    class StepClock(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kw):
            self.marks = [now()]

        def on_step_end(self, args, state, control, **kw):
            self.marks.append(now())

    return StepClock()


# ---------------------------------------------------------------------------------------------
# measuring one variant (child process)


def logps_check(trainer, n_pairs: int) -> dict:
    """Summed completion log-probs of the first n_pairs, packed forward against TRL's padded one (no grad)."""
    import torch
    base = trainer.model.get_base_model()
    if getattr(base, "_scalelab_packing", None) is None:
        return {}
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(n_pairs)])
    batch = {k: v.to(trainer.accelerator.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
              fused_lm_head=True, use_cache=False)
    with torch.no_grad():
        packed = base.forward(**kw).log_probs.float().sum(1)
        padded = base.forward.__wrapped__(**kw).log_probs.float().sum(1)
    diff = (packed - padded).abs()
    return {"max_abs_nats": float(diff.max()), "max_rel": float((diff / padded.abs().clamp(min=1e-6)).max()),
            "padded_logps": padded.tolist(), "packed_logps": packed.tolist()}


def measure(v: Variant, s: Settings) -> VariantResult:
    from scalelab.dpo.train import peak_memory_gib
    t0 = time.perf_counter()
    rows = bench_rows(s)
    model, tokenizer = load_model(s)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(v, s, model, tokenizer, rows, out_dir)
        setup_s = time.perf_counter() - t0
        check = logps_check(trainer, s.batch_pairs)
        recorder, clock = BatchRecorder(trainer.data_collator), step_clock(s.device)
        trainer.data_collator = recorder
        trainer.add_callback(clock)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    tokens = [int(h["num_tokens"]) for h in logs]
    return VariantResult(
        v.name, True, setup_s=setup_s, ref_precompute_s=getattr(trainer, "ref_precompute_s", 0.0),
        step_s=[b - a for a, b in zip(clock.marks, clock.marks[1:])],
        real_tokens=[b - a for a, b in zip([0] + tokens, tokens)], padded_tokens=recorder.padded[:s.total_steps],
        shared_tokens=recorder.shared[:s.total_steps], losses=[h["loss"] for h in logs],
        margins=[h.get("rewards/margins") for h in logs], peak_memory_gib=peak_memory_gib(s.device),
        logps_check=check, trainer_args=trainer.args.to_dict(), wall_s=time.perf_counter() - t0)


def child_main(name: str, s: Settings, out: Path) -> None:
    """Never raises: a failed variant (e.g. out of memory) is recorded with its error."""
    import torch
    if s.device == "cpu":
        torch.set_num_threads(1)  # a shared CPU: OpenMP spin-waits slow tiny ops down
    try:
        res = measure(VARIANTS[name], s)
    except Exception as e:  # noqa: BLE001 - the record carries it
        import traceback
        traceback.print_exc()
        res = VariantResult(name, False, error=f"{type(e).__name__}: {e}"[:2000])
    from scalelab.core.jsonio import write_json
    write_json(out, asdict(res))


# ---------------------------------------------------------------------------------------------
# comparing (parent process)


def run_child(name: str, s: Settings, timeout_s: float) -> VariantResult:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, __file__, "--child", name, "--child-out", str(out),
               "--settings", json.dumps(asdict(s))]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return VariantResult(name, False, error=f"timed out after {timeout_s:.0f} s")
        if not out.is_file():
            tail = (proc.stderr or proc.stdout)[-1500:]
            return VariantResult(name, False, error=f"exit {proc.returncode}: {tail}", wall_s=time.perf_counter() - t0)
        d = json.loads(out.read_text())
        if not d["ok"]:
            print(proc.stderr[-3000:], file=sys.stderr)
        return VariantResult(**d)


def throughput(r: VariantResult, s: Settings) -> dict:
    m = slice(s.warmup_steps, s.total_steps)
    step_s, real = sum(r.step_s[m]), sum(r.real_tokens[m])
    precompute_share_s = r.ref_precompute_s * s.measured_steps / s.total_steps
    return {"tokens_per_s": real / step_s, "tokens_per_s_end_to_end": real / (step_s + precompute_share_s),
            "step_s_mean": step_s / s.measured_steps, "precompute_share_s": precompute_share_s,
            "real_tokens_per_step": real / s.measured_steps,
            "padded_tokens_per_step": sum(r.padded_tokens[m]) / s.measured_steps,
            "shared_prompt_tokens_per_step": sum(r.shared_tokens[m]) / s.measured_steps}


def flag_diff(a: dict, b: dict) -> dict:
    skip = {"output_dir", "logging_dir", "run_name"}
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if k not in skip and a.get(k) != b.get(k)}


# bf16 backward kernels (attention's atomic adds) are not bitwise repeatable, and Adam's first steps are close to
# sign(g), so two runs of the SAME config drift apart; a variant computes the same loss when it stays within that
# measured drift (with a margin for a 10-step sample) or within loss_atol, whichever is larger.
NOISE_FACTOR = 1.5
TOLERANCE_RULE = ("every run of a variant against trl_default's first run: max |dloss| over the steps <= "
                  "max(loss_atol, NOISE_FACTOR x the largest max |dloss| of that run against trl_default's reruns)")


def max_loss_diff(a: VariantResult, b: VariantResult) -> float:
    return max((abs(x - y) for x, y in zip(a.losses, b.losses)), default=math.inf)


def runs_by_variant(results: list[VariantResult]) -> dict[str, list[VariantResult]]:
    """Each variant's runs in repeat order, variants in the order they first ran."""
    by: dict[str, list[VariantResult]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    return {name: sorted(runs, key=lambda r: r.repeat) for name, runs in by.items()}


def median_throughput(runs: list[VariantResult], s: Settings) -> dict:
    """Every throughput figure as its median over the successful runs (one run: that run's figures)."""
    each = [throughput(r, s) for r in runs if r.ok]
    return {k: statistics.median(t[k] for t in each) for k in each[0]} if each else {}


def per_repeat(runs: list[VariantResult], s: Settings) -> list[dict]:
    out = []
    for r in runs:
        t = throughput(r, s) if r.ok else {}
        out.append({"repeat": r.repeat, "ok": r.ok, "error": r.error, "tokens_per_s": t.get("tokens_per_s"),
                    "tokens_per_s_end_to_end": t.get("tokens_per_s_end_to_end")})
    return out


def variant_row(runs: list[VariantResult], s: Settings) -> dict:
    row = {"ok": all(r.ok for r in runs), "error": next((r.error for r in runs if not r.ok), ""),
           "repeats": per_repeat(runs, s)}
    if any(r.ok for r in runs):
        row["throughput"] = median_throughput(runs, s)
    return row


def noise_floor(base_runs: list[VariantResult], reruns: list[VariantResult]) -> float:
    """Largest loss drift of trl_default's first run against its other repeats and trl_default_repeat; 0 = none."""
    others = base_runs[1:] + [r for r in reruns if r.ok]
    return max((max_loss_diff(base_runs[0], r) for r in others), default=0.0)


def changes_vs_trl(recipe: dict, trl_args: dict) -> list[dict]:
    """The recipe's departures from TRL's defaults, each with the DPOConfig switch that does the same, if any.
    trl_args is trl_default's recorded DPOConfig: its defaults and field names are the installed trl's."""
    out = []
    for key, value in recipe.items():
        sw = TRL_EQUIVALENT.get((key, value), TrlSwitch("", None, "no TRL equivalent known to this bench"))
        if sw.trl_field and sw.trl_field in trl_args and trl_args[sw.trl_field] == sw.trl_value:
            continue  # TRL's default already: not a difference
        plain = bool(sw.trl_field) and sw.trl_field in trl_args
        note = sw.note if plain or not sw.trl_field else f"no field {sw.trl_field!r} in the installed DPOConfig"
        out.append({"ours": f"train.{key}={json.dumps(value)}", "plain_trl_switch": plain, "note": note,
                    "trl": f"DPOConfig({sw.trl_field}={sw.trl_value!r})" if plain else ""})
    return out


def compare(base_runs: list[VariantResult], runs: list[VariantResult], s: Settings, tolerance: float) -> dict:
    """runs against trl_default: ratio of median speeds, same batches, and every run's loss against the base's
    first run."""
    base, ok = base_runs[0], [r for r in runs if r.ok]
    tb, tr = median_throughput(base_runs, s), median_throughput(ok, s)
    diffs = [max_loss_diff(base, r) for r in ok]
    same_len = all(len(r.losses) == s.total_steps for r in [base, *ok])
    base_by_repeat = {r.repeat: throughput(r, s)["tokens_per_s"] for r in base_runs}
    return {"speedup_step": tr["tokens_per_s"] / tb["tokens_per_s"],
            "speedup_end_to_end": tr["tokens_per_s_end_to_end"] / tb["tokens_per_s_end_to_end"],
            "speedup_step_per_repeat": {str(r.repeat): throughput(r, s)["tokens_per_s"] / base_by_repeat[r.repeat]
                                        for r in ok if r.repeat in base_by_repeat},
            "same_batches": all(r.real_tokens == base.real_tokens for r in ok),
            "loss_max_abs_diff": max(diffs), "loss_max_abs_diff_per_repeat": diffs,
            "equal_loss": len(ok) == len(runs) and same_len and max(diffs) <= tolerance,
            "dpo_config_diff": flag_diff(base.trainer_args, ok[0].trainer_args),
            "recipe": VARIANTS[ok[0].name].recipe,
            "changes_vs_trl": changes_vs_trl(VARIANTS[ok[0].name].recipe, base.trainer_args)}


def summarize(results: list[VariantResult], s: Settings) -> dict:
    by = runs_by_variant(results)
    rows = {name: variant_row(runs, s) for name, runs in by.items()}
    base_runs = [r for r in by.get("trl_default", []) if r.ok]
    floor = noise_floor(base_runs, by.get("trl_default_repeat", [])) if base_runs else 0.0
    tolerance = max(s.loss_atol, NOISE_FACTOR * floor)
    if base_runs:
        for name, runs in by.items():
            if name != "trl_default" and any(r.ok for r in runs):
                rows[name]["vs_trl_default"] = compare(base_runs, runs, s, tolerance)
    ours = rows.get("ours", {}).get("vs_trl_default", {})
    return {"variants": rows, "repeats": 1 + max((r.repeat for r in results), default=0),
            "run_order": [[r.name, r.repeat] for r in results], "loss_noise_floor": floor,
            "loss_tolerance": tolerance, "loss_tolerance_rule": TOLERANCE_RULE, "speedup_goal": SPEEDUP_GOAL,
            "meets_goal": bool(ours) and ours["speedup_step"] >= SPEEDUP_GOAL,
            "ours_changes_vs_trl": ours.get("changes_vs_trl", []),
            "passed": bool(ours.get("equal_loss") and ours.get("same_batches"))}


# ---------------------------------------------------------------------------------------------
# report (parent process)


def format_table(summary: dict, results: list[VariantResult]) -> str:
    peak = {name: max(r.peak_memory_gib for r in runs) for name, runs in runs_by_variant(results).items()}
    head = (f"{'variant':<20}{'tok/s step':>12}{'tok/s e2e':>12}{'step s':>9}{'peak GiB':>10}"
            f"{'x step':>8}{'x e2e':>8}{'max|dloss|':>12}  same batches")
    lines = [f"medians over {summary['repeats']} repeat(s); x = ratio of medians against trl_default", head,
             "-" * len(head)]
    for name, row in summary["variants"].items():
        if "throughput" not in row:
            lines.append(f"{name:<20}FAILED: {row['error'][:90]}")
            continue
        t, c = row["throughput"], row.get("vs_trl_default", {})
        lines.append(f"{name:<20}{t['tokens_per_s']:>12.0f}{t['tokens_per_s_end_to_end']:>12.0f}"
                     f"{t['step_s_mean']:>9.3f}{peak[name]:>10.2f}"
                     f"{c.get('speedup_step', 1.0):>8.2f}{c.get('speedup_end_to_end', 1.0):>8.2f}"
                     f"{c.get('loss_max_abs_diff', 0.0):>12.2e}  {c.get('same_batches', True)}")
    if summary["repeats"] > 1:
        for name, row in summary["variants"].items():
            each = " ".join("failed" if not x["ok"] else f"{x['tokens_per_s']:.0f}/{x['tokens_per_s_end_to_end']:.0f}"
                            for x in row["repeats"])
            lines.append(f"tok/s step/e2e per repeat {name:<20} {each}")
    for r in results:
        if r.ok:
            lines.append(f"loss {r.name + '#' + str(r.repeat):<22} " + " ".join(f"{x:.5f}" for x in r.losses))
    lines.append(f"loss noise floor (trl_default vs its reruns): {summary['loss_noise_floor']:.2e}; "
                 f"tolerance {summary['loss_tolerance']:.2e}")
    lines += change_lines(summary)
    lines.append(f"equal-loss check (ours vs trl_default): {'PASSED' if summary['passed'] else 'FAILED'}")
    return "\n".join(lines)


def change_lines(summary: dict) -> list[str]:
    ours = summary["variants"].get("ours", {}).get("vs_trl_default")
    if not ours:
        return []
    lines = [f"ours / trl_default, median step tokens/s: {ours['speedup_step']:.2f}x (goal {SPEEDUP_GOAL}x: "
             f"{'met' if summary['meets_goal'] else 'not met'}); end-to-end {ours['speedup_end_to_end']:.2f}x"]
    for name, row in summary["variants"].items():  # the ablations too: which part of each gain TRL users have
        for c in row.get("vs_trl_default", {}).get("changes_vs_trl", []):
            what = f"a plain TRL switch, {c['trl']}" if c["plain_trl_switch"] else "not a TRL switch"
            lines.append(f"  {name} differs from TRL's defaults by {c['ours']}: {what}"
                         + (f" ({c['note']})" if c["note"] else ""))
    return lines


def provenance(extra: dict) -> dict:
    from scalelab.core.provenance import collect, package_versions
    info = collect({"command": shlex.join([sys.executable, *sys.argv]), **extra})
    info["packages"] = package_versions(("torch", "transformers", "trl", "peft", "datasets", "accelerate",
                                         "triton", "numpy"))
    info["env"] = {k: os.environ[k] for k in ENV_RECORDED if k in os.environ}
    import torch
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30, "cuda": torch.version.cuda}
    else:
        info["gpu"] = "none"
    return info


# ---------------------------------------------------------------------------------------------
# real model and pairs (parent process): resolved and checked once, before any variant runs


def model_source(name: str) -> ModelSource:
    from scalelab.core.errors import ScalelabError
    from scalelab.core.hfmodel import SOURCE_FILE, materialize, sha256_file
    from scalelab.core.models import registry
    try:
        folder = materialize(name)
    except (ScalelabError, OSError, ValueError) as e:
        raise SystemExit(f"--model {name}: {e}") from None
    if not Path(folder).is_dir():
        raise SystemExit(f"--model {name}: resolves to the hub id {folder!r}, not a local folder; the bench does "
                         f"not download weights: give a registry name with a local copy or an HF folder")
    config = Path(folder) / "config.json"
    if not config.is_file():
        raise SystemExit(f"--model {name}: {folder} has no config.json (not an HF model folder)")
    pinned = getattr(registry().get(name), "gguf_sha256", "")
    source = Path(folder) / SOURCE_FILE   # a cached GGUF conversion names the GGUF it came from
    if not pinned and source.is_file():
        pinned = json.loads(source.read_text()).get("gguf_sha256", "")
    return ModelSource(name, str(Path(folder).resolve()), sha256_file(config), pinned)


def pairs_source(path: str, s: Settings) -> PairsSource:
    from scalelab.core.hfmodel import sha256_file
    from scalelab.dpo.data import MalformedRow, load_pairs
    f = Path(path)
    if not f.is_file():
        raise SystemExit(f"--pairs {path}: no such file (a PreferencePair jsonl, e.g. a dpo run's preferences.jsonl)")
    try:
        count = len(load_pairs("pairs", str(f)).pairs)
    except MalformedRow as e:
        raise SystemExit(f"--pairs: {e}") from None
    needed = s.total_steps * s.batch_pairs
    if count < needed:
        raise SystemExit(f"--pairs {path}: {count} pairs, the run needs {needed} (batch_pairs {s.batch_pairs} x "
                         f"(warmup_steps {s.warmup_steps} + measured_steps {s.measured_steps}))")
    return PairsSource(str(f.resolve()), sha256_file(f), count, needed)


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON results file")
    p.add_argument("--tiny", action="store_true", help="tiny settings on CPU, seq 128 (smoke test; with --model: "
                                                       "that model at these settings)")
    p.add_argument("--model", default="", metavar="NAME_OR_FOLDER",
                   help="real weights: a scalelab.core.models registry name or a local HF folder; "
                        "default: random weights of the Qwen2.5-7B shape")
    p.add_argument("--pairs", default="", metavar="FILE",
                   help="real preference pairs: a PreferencePair jsonl (needs --model); default: synthetic")
    p.add_argument("--repeats", type=int, default=1, help="runs of every variant, alternating (see run_plan)")
    p.add_argument("--variants", default="", help=f"comma list from {', '.join(VARIANTS)}; default all")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="skip ablations once this much wall time is used (the required variants always run)")
    p.add_argument("--child-timeout-s", type=float, default=300.0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                   help="override a Settings field, e.g. --set measured_steps=4")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    s = TINY if args.tiny else Settings()
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in Settings.__dataclass_fields__:
            raise SystemExit(f"--set {item}: unknown field {key!r}; fields: {', '.join(Settings.__dataclass_fields__)}")
        v = json.loads(value)
        s = replace(s, **{key: tuple(v) if isinstance(v, list) else v})
    return s


def run_plan(names: list[str], repeats: int) -> list[tuple[str, int]]:
    """(variant, repeat) in run order: A B, then B A, then A B ... Alternating spreads slow drift (GPU clocks and
    temperature, page cache, a neighbour's load) over every variant instead of charging it to whichever runs
    last; reversing each round, rather than A B A B, also cancels a drift linear in time for two variants
    (A at positions 0 and 3, B at 1 and 2). trl_default still runs first of all."""
    plan: list[tuple[str, int]] = []
    for r in range(repeats):
        plan += [(name, r) for name in (names if r % 2 == 0 else names[::-1])]
    return plan


def run_all(plan: list[tuple[str, int]], s: Settings, budget_s: float, timeout_s: float) -> list[VariantResult]:
    t0, results, repeats = time.perf_counter(), [], 1 + max(r for _, r in plan)
    for name, rep in plan:
        elapsed = time.perf_counter() - t0
        last = results[-1].wall_s if results else 0.0
        if name not in REQUIRED and elapsed + last > budget_s:
            results.append(VariantResult(name, False, repeat=rep,
                                         error=f"skipped: {elapsed:.0f} s of {budget_s:.0f} s used"))
            continue
        results.append(replace(run_child(name, s, timeout_s), repeat=rep))
        r = results[-1]
        print(f"{name} #{rep + 1}/{repeats}: {'ok' if r.ok else 'FAILED ' + r.error[:200]} ({r.wall_s:.0f} s)",
              flush=True)
    return results


def variant_names(args: argparse.Namespace) -> list[str]:
    # --tiny (CPU, deterministic: no repeat needed): the baseline, the recipe and one packed layout
    default = ("trl_default", "ours", "ours_shared_prompt") if args.tiny else tuple(VARIANTS)
    names = [n for n in (args.variants.split(",") if args.variants else default) if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "trl_default" not in names:
        raise SystemExit(f"--variants: need trl_default; unknown {unknown}; known: {', '.join(VARIANTS)}")
    return ["trl_default"] + [n for n in names if n != "trl_default"]  # first: warms Triton's on-disk cache


def real_inputs(args: argparse.Namespace, s: Settings) -> tuple[Settings, ModelSource | None, PairsSource | None]:
    if args.pairs and not args.model:
        raise SystemExit("--pairs needs --model: the random-weight shape's word tokenizer has no chat template")
    model = model_source(args.model) if args.model else None
    if model:
        s = replace(s, model_folder=model.folder)
    pairs = pairs_source(args.pairs, s) if args.pairs else None
    if pairs:
        s = replace(s, pairs_file=pairs.path)
    return s, model, pairs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        d = json.loads(args.settings)
        s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        child_main(args.child, s, args.child_out)
        return 0
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: must be >= 1")
    names = variant_names(args)
    s, model, pairs = real_inputs(args, settings_from(args))
    print(f"equal-loss tolerance, fixed before the runs: {TOLERANCE_RULE}; loss_atol {s.loss_atol:g}, "
          f"NOISE_FACTOR {NOISE_FACTOR}", flush=True)
    results = run_all(run_plan(names, args.repeats), s, args.budget_s, args.child_timeout_s)
    summary = summarize(results, s)
    print(format_table(summary, results))
    if args.out:
        from scalelab.core.jsonio import write_json
        inputs = {"model": asdict(model) if model else None, "pairs": asdict(pairs) if pairs else None,
                  "repeats": args.repeats}
        write_json(args.out, {
            "schema": "scalelab.bench.dpo_throughput/1", "what": __doc__.split("\n")[0],
            "provenance": provenance(inputs), "settings": asdict(s), **inputs,
            "model_shape": None if model else asdict(SHAPES[s.shape]),
            "variants_described": {n: VARIANTS[n].what for n in names}, "summary": summary,
            "results": [asdict(r) for r in results]})
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
