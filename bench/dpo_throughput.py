"""LoRA-DPO throughput on one GPU: TRL's defaults against our recipe, same random-weight model, data order and seeds.

    python3 bench/dpo_throughput.py --out results/h200/dpo_throughput_qwen7b.json     # Qwen2.5-7B shape, cuda, bf16
    python3 bench/dpo_throughput.py --tiny --out /tmp/dpo_tiny.json                   # CPU smoke test, < 1 min

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

Data: synthetic preference pairs of random token ids; prompt length ~ U{64..1024}, chosen and rejected lengths
~ U{32..1024} each, drawn independently (+1 EOS), each sequence truncated to 2048 tokens (TRL keep_start).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
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
ENV_RECORDED = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "TQDM_DISABLE", "NCCL_NVLS_ENABLE", "PYTHONPATH")


@dataclass(frozen=True)
class VariantResult:
    name: str
    ok: bool
    error: str = ""
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
    tokenizer = word_tokenizer(SHAPES[s.shape].vocab)
    rows = synthetic_rows(s, SHAPES[s.shape].vocab)
    model = build_model(s)
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


def max_loss_diff(a: VariantResult, b: VariantResult) -> float:
    return max((abs(x - y) for x, y in zip(a.losses, b.losses)), default=math.inf)


def compare(base: VariantResult, r: VariantResult, s: Settings, noise_floor: float) -> dict:
    """r against trl_default: speed-ups, same batches, and the loss check."""
    tb, tr = throughput(base, s), throughput(r, s)
    loss_diff = max_loss_diff(base, r)
    same_len = len(base.losses) == len(r.losses) == s.total_steps
    return {"speedup_step": tr["tokens_per_s"] / tb["tokens_per_s"],
            "speedup_end_to_end": tr["tokens_per_s_end_to_end"] / tb["tokens_per_s_end_to_end"],
            "same_batches": base.real_tokens == r.real_tokens, "loss_max_abs_diff": loss_diff,
            "equal_loss": same_len and loss_diff <= max(s.loss_atol, NOISE_FACTOR * noise_floor),
            "dpo_config_diff": flag_diff(base.trainer_args, r.trainer_args),
            "recipe": VARIANTS[r.name].recipe}


def summarize(results: list[VariantResult], s: Settings) -> dict:
    ok = {r.name: r for r in results if r.ok}
    rows = {r.name: {"ok": r.ok, "error": r.error, **({"throughput": throughput(r, s)} if r.ok else {})}
            for r in results}
    noise_floor = 0.0   # no repeat run: the tolerance is loss_atol alone
    if "trl_default" in ok:
        if "trl_default_repeat" in ok:
            noise_floor = max_loss_diff(ok["trl_default"], ok["trl_default_repeat"])
        for name, r in ok.items():
            if name != "trl_default":
                rows[name]["vs_trl_default"] = compare(ok["trl_default"], r, s, noise_floor)
    ours = rows.get("ours", {}).get("vs_trl_default", {})
    return {"variants": rows, "loss_noise_floor": noise_floor, "loss_tolerance": max(s.loss_atol, NOISE_FACTOR * noise_floor),
            "passed": bool(ours.get("equal_loss") and ours.get("same_batches"))}


# ---------------------------------------------------------------------------------------------
# report (parent process)


def format_table(summary: dict, results: list[VariantResult]) -> str:
    by = {r.name: r for r in results}
    head = (f"{'variant':<20}{'tok/s step':>12}{'tok/s e2e':>12}{'step s':>9}{'peak GiB':>10}"
            f"{'x step':>8}{'x e2e':>8}{'max|dloss|':>12}  same batches")
    lines = [head, "-" * len(head)]
    for name, row in summary["variants"].items():
        if not row["ok"]:
            lines.append(f"{name:<20}FAILED: {row['error'][:90]}")
            continue
        t, c = row["throughput"], row.get("vs_trl_default", {})
        lines.append(f"{name:<20}{t['tokens_per_s']:>12.0f}{t['tokens_per_s_end_to_end']:>12.0f}"
                     f"{t['step_s_mean']:>9.3f}{by[name].peak_memory_gib:>10.2f}"
                     f"{c.get('speedup_step', 1.0):>8.2f}{c.get('speedup_end_to_end', 1.0):>8.2f}"
                     f"{c.get('loss_max_abs_diff', 0.0):>12.2e}  {c.get('same_batches', True)}")
    for r in results:
        if r.ok:
            lines.append(f"loss {r.name:<18} " + " ".join(f"{x:.5f}" for x in r.losses))
    lines.append(f"loss noise floor (trl_default vs its repeat): {summary['loss_noise_floor']:.2e}; "
                 f"tolerance {summary['loss_tolerance']:.2e}")
    lines.append(f"equal-loss check (ours vs trl_default): {'PASSED' if summary['passed'] else 'FAILED'}")
    return "\n".join(lines)


def provenance() -> dict:
    from scalelab.core.provenance import collect, package_versions
    info = collect({"command": shlex.join([sys.executable, *sys.argv])})
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
# main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON results file")
    p.add_argument("--tiny", action="store_true", help="tiny shape on CPU, seq 128 (smoke test)")
    p.add_argument("--variants", default="", help=f"comma list from {', '.join(VARIANTS)}; default all")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="skip ablations once this much wall time is used (the two required variants always run)")
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


def run_all(names: list[str], s: Settings, budget_s: float, timeout_s: float) -> list[VariantResult]:
    t0, results = time.perf_counter(), []
    for name in names:
        elapsed = time.perf_counter() - t0
        last = results[-1].wall_s if results else 0.0
        if name not in REQUIRED and elapsed + last > budget_s:
            results.append(VariantResult(name, False, error=f"skipped: {elapsed:.0f} s of {budget_s:.0f} s used"))
            continue
        results.append(run_child(name, s, timeout_s))
        r = results[-1]
        print(f"{name}: {'ok' if r.ok else 'FAILED ' + r.error[:200]} ({r.wall_s:.0f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        d = json.loads(args.settings)
        s = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        child_main(args.child, s, args.child_out)
        return 0
    s = settings_from(args)
    # --tiny (CPU, deterministic: no repeat needed): the baseline, the recipe and one packed layout
    default = ("trl_default", "ours", "ours_shared_prompt") if args.tiny else tuple(VARIANTS)
    names = [n for n in (args.variants.split(",") if args.variants else default) if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "trl_default" not in names:
        raise SystemExit(f"--variants: need trl_default; unknown {unknown}; known: {', '.join(VARIANTS)}")
    names = ["trl_default"] + [n for n in names if n != "trl_default"]  # first: warms Triton's on-disk cache
    results = run_all(names, s, args.budget_s, args.child_timeout_s)
    summary = summarize(results, s)
    print(format_table(summary, results))
    if args.out:
        from scalelab.core.jsonio import write_json
        write_json(args.out, {
            "schema": "scalelab.bench.dpo_throughput/1", "what": __doc__.split("\n")[0],
            "provenance": provenance(), "settings": asdict(s), "model_shape": asdict(SHAPES[s.shape]),
            "variants_described": {n: VARIANTS[n].what for n in names}, "summary": summary,
            "results": [asdict(r) for r in results]})
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
