"""Rollout throughput and weight-sync cost of the GRPO loop's engines, on one batch, written as rollout_bench.json
(the input of `scalelab grpo docs`).

(a) tokens/s of vLLM in the trainer's process (rollout.engine vllm_colocated) vs the trainer's own HF `generate`
    (HFGenerateEngine) on the same batch: same prompt ids, same sampling (n, temperature, top_p, seed), same
    max_new_tokens; completion tokens / wall-clock of the generate call, median of --repeats after a warm-up.
(b) weight-sync ms of the colocated in-place load (model.load_weights, no file) for the full-weight policy and
    for a LoRA policy (the sync merges W + (alpha/r) B A per layer on the fly), median of --repeats;
(c) one full-weight AdamW optimizer step on the same batch (update ms), so each sync's share of the stated step
    rollout (fastest engine) + update + sync can be given.
HF always runs first in the same process on the same batch: ratio_vllm_over_hf is only ever against that baseline.
vLLM's tuning options (--max-num-seqs, --cudagraph-max, --no-flat-logprobs) are written to "vllm_options", as
asked and as the engine ran them, so variants (one process each: vLLM does not hand GPU memory back in-process)
can be compared; bench/gpu_grpo.sh PART variants runs a set.

    # GPU (H200): a random-weight Qwen2.5-1.5B-shaped model with the tokenizer found in --tokenizer
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --out rollout_bench.json
    # a variant: 1,024 sequences with CUDA graphs up to 1,024 (vLLM's default stops at 512), no sync/update timing
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --prompts 64 \
        --group 16 --cudagraph-max 1024 --repeats 2 --no-update --no-sync --out flat-graphs-1024.json
    # CPU plumbing: a tiny random Llama, HF engine only, sync into an own HF copy
    python bench/grpo_rollout_bench.py --tiny --out /tmp/rollout_bench.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from scalelab.core.config import ConfigError
from scalelab.core.jsonio import write_json
from scalelab.grpo.advantages import group_advantages
from scalelab.grpo.batch import collate
from scalelab.grpo.config import LoraConfig, load_grpo_config
from scalelab.grpo.parts import apply_lora, encode_prompt
from scalelab.grpo.rollout import EngineContext, SamplingParams, build_engine
from scalelab.grpo.weightsync import sync_weights


@dataclass(frozen=True)
class EngineResult:
    tokens_per_s: float  # median run's completion tokens / its wall-clock
    median_ms: float  # the engine's own timing: the generate call of vLLM / HF
    median_call_ms: float  # that run's whole engine.generate (adds the cut at stop tokens, logprob parsing, decode)
    completion_tokens: int  # of the median run
    runs_ms: tuple[float, ...]
    finished_frac: float  # sequences that ended on a stop token (the rest ran to max_new_tokens)


@dataclass(frozen=True)
class SyncResult:
    label: str
    method: str
    median_ms: float
    bytes: int
    runs_ms: tuple[float, ...]


# ---------------------------------------------------------------------------------------------
# setup


def load_model(args: argparse.Namespace) -> tuple[torch.nn.Module, object, dict]:
    from scalelab.core.hfmodel import load_causal_lm
    from scalelab.grpo.randmodel import char_tokenizer, random_model
    device = "cpu" if args.tiny else args.device
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if args.model.startswith("random:"):
        shape = args.model.split(":", 1)[1]
        if args.tokenizer:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        else:
            tokenizer = char_tokenizer()
        model = random_model(shape, tokenizer, dtype, device, args.seed)
    else:
        model, tokenizer = load_causal_lm(args.model, "auto", device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    n_params = sum(p.numel() for p in model.parameters())
    desc = {"name": args.model, "n_params": n_params, "dtype": str(dtype).removeprefix("torch."),
            "random_weights": args.model.startswith("random:"), "vocab_size": model.config.vocab_size,
            "layers": model.config.num_hidden_layers, "hidden_size": model.config.hidden_size}
    return model, tokenizer, desc


def make_prompts(tokenizer: object, n: int, seed: int) -> list[list[int]]:
    """n arithmetic training prompts (2-digit sums), chat-templated, as token ids."""
    from scalelab.evals.tasks import get_task
    examples = get_task("arithmetic", digits=2).load("train", limit=n, seed=seed)
    return [encode_prompt(tokenizer, ex.prompt) for ex in examples]


def grpo_config(args: argparse.Namespace, engine: str):
    return load_grpo_config(None, [
        f"rollout.engine={engine}", "model.lora.enabled=false", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"optim.micro_batch_size={args.micro_batch}",
        f"rollout.server.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.server.max_model_len={args.max_model_len}", f"rollout.server.enforce_eager={str(args.eager).lower()}",
        f"rollout.server.max_num_seqs={args.max_num_seqs}",
        f"rollout.server.max_cudagraph_capture_size={args.cudagraph_max}",
        f"rollout.server.flat_logprobs={str(not args.no_flat_logprobs).lower()}", "optim.lr=1e-6"])


def build(name: str, model: torch.nn.Module, tokenizer: object, args: argparse.Namespace, method: str,
          workdir: Path, lora_rank: int = 0):
    cfg = grpo_config(args, name)
    return build_engine(name, EngineContext(model, tokenizer, cfg.rollout, lora_rank, method, workdir, args.seed))


# ---------------------------------------------------------------------------------------------
# measure


def timed_generate(engine: object, prompts: list[list[int]], params: SamplingParams) -> tuple:
    """(batch, ms of the whole engine.generate call)."""
    t0 = time.perf_counter()
    batch = engine.generate(prompts, params)
    return batch, (time.perf_counter() - t0) * 1e3


def time_engine(engine: object, prompts: list[list[int]], params: SamplingParams, repeats: int) -> tuple:
    """(EngineResult, the last batch): one untimed call on the whole batch, then `repeats` timed calls.
    The warm-up has the timed calls' shapes: a first large batch pays allocator growth and kernel selection
    (measured on an H200: HF generate's first 1,024-sequence batch took 21.9 s, the next 7.4 s)."""
    engine.generate(prompts, params)
    runs, call_ms = zip(*[timed_generate(engine, prompts, params) for _ in range(repeats)])
    ms = [b.generation_ms for b in runs]
    mid = sorted(range(len(runs)), key=lambda i: ms[i])[len(runs) // 2]
    b = runs[mid]
    return EngineResult(b.num_tokens / (b.generation_ms / 1e3), b.generation_ms, call_ms[mid],
                        b.num_tokens, tuple(ms), sum(b.finished) / len(b.finished)), runs[-1]


def time_update(model: torch.nn.Module, tokenizer: object, batch: object, args: argparse.Namespace) -> float:
    """ms of one full-weight AdamW step on `batch` (the second of two: the first allocates optimizer state)."""
    from scalelab.grpo.train import make_optimizer, optimizer_step
    cfg = grpo_config(args, "hf")
    rewards = torch.rand(len(batch.texts), generator=torch.Generator().manual_seed(args.seed))
    t = collate(batch, group_advantages(rewards, args.group), tokenizer.pad_token_id or 0,
                next(model.parameters()).device)
    opt = make_optimizer(model, cfg)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        optimizer_step(model, t, opt, cfg, None, None, first=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    del opt
    model.eval()
    return times[-1]


def time_sync(label: str, method: str, policy: object, engine: object, repeats: int, workdir: Path) -> SyncResult:
    recs = [sync_weights(method, policy, engine, v + 1, workdir) for v in range(repeats + 1)][1:]  # first: warm-up
    return SyncResult(label, method, statistics.median(r.sync_ms for r in recs), recs[-1].bytes,
                      tuple(r.sync_ms for r in recs))


# ---------------------------------------------------------------------------------------------
# the run


def check_context(prompts: list[list[int]], args: argparse.Namespace) -> None:
    """vLLM refuses a request whose prompt + max_tokens exceeds max_model_len: say so before HF and vLLM run."""
    longest = max(map(len, prompts))
    need = longest + args.max_new_tokens
    if "vllm_colocated" in args.engines and need > args.max_model_len:
        raise SystemExit(f"--max-model-len {args.max_model_len} is below the longest prompt ({longest} tokens) + "
                         f"--max-new-tokens ({args.max_new_tokens}) = {need}; raise --max-model-len")


def measure_engines(model: torch.nn.Module, tokenizer: object, prompts: list[list[int]], params: SamplingParams,
                    args: argparse.Namespace, workdir: Path) -> tuple[dict, object, object]:
    """({engine: EngineResult}, the vLLM engine or None, the last batch). HF first: the same-run baseline."""
    engines = {}
    hf = build("hf", model, tokenizer, args, "shared", workdir / "hf")
    engines["hf"], batch = time_engine(hf, prompts, params, args.repeats)
    vllm = None
    if "vllm_colocated" in args.engines:
        vllm = build("vllm_colocated", model, tokenizer, args, "inplace", workdir / "vllm")
        engines["vllm_colocated"], batch = time_engine(vllm, prompts, params, args.repeats)
    return engines, vllm, batch


def measure_syncs(model: torch.nn.Module, tokenizer: object, target: object, args: argparse.Namespace,
                  workdir: Path) -> list[SyncResult]:
    """Full-weight then LoRA in-place syncs into `target` (the vLLM engine, or on CPU an own HF copy)."""
    target = target or build("hf", model, tokenizer, args, "inplace", workdir / "hf-copy")
    syncs = [time_sync("in-place, full weights", "inplace", model, target, args.repeats, workdir / "sync")]
    lora = apply_lora(model, LoraConfig(r=args.lora_rank, alpha=2.0 * args.lora_rank))
    syncs.append(time_sync(f"in-place, LoRA r={args.lora_rank} merged on the fly", "inplace", lora, target,
                           args.repeats, workdir / "sync"))
    return syncs


def vllm_options(args: argparse.Namespace, vllm: object) -> dict:
    """The options asked for (0 = vLLM's default) and, when vLLM ran, the values it resolved them to."""
    asked = {"max_num_seqs": args.max_num_seqs, "max_cudagraph_capture_size": args.cudagraph_max,
             "flat_logprobs": not args.no_flat_logprobs, "enforce_eager": args.eager,
             "gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": args.max_model_len}
    return {"requested": asked, "effective": vllm.describe() if vllm is not None else None}


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    model, tokenizer, desc = load_model(args)
    prompts = make_prompts(tokenizer, args.prompts, args.seed)
    check_context(prompts, args)
    params = SamplingParams(args.group, args.temperature, args.top_p, args.max_new_tokens, args.seed)
    engines, vllm, batch = measure_engines(model, tokenizer, prompts, params, args, workdir)
    update_ms = None if args.no_update else time_update(model, tokenizer, batch, args)
    options = vllm_options(args, vllm)
    syncs = [] if args.no_sync else measure_syncs(model, tokenizer, vllm, args, workdir)
    if vllm is not None:
        vllm.close()
    hf_tps, v = engines["hf"].tokens_per_s, engines.get("vllm_colocated")
    return {"model": desc, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else
            platform.processor() or "cpu",
            "batch": {"prompts": args.prompts, "group_size": args.group, "sequences": args.prompts * args.group,
                      "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
                      "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p},
            "engines": {k: asdict(e) for k, e in engines.items()}, "baseline": "hf",
            "ratio_vllm_over_hf": None if v is None else v.tokens_per_s / hf_tps, "update_ms": update_ms,
            "vllm_options": options, "weight_sync": [asdict(s) for s in syncs]}


def provenance() -> dict:
    import transformers
    from scalelab.core.provenance import git_sha
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
           "command": " ".join(sys.argv), "unix_time": time.time(), "git_sha": git_sha()}
    try:
        import vllm
        out["vllm"] = vllm.__version__
    except ImportError:
        out["vllm"] = None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:qwen2.5-1.5b",
                   help="random:<shape> (grpo.randmodel.SHAPES), a local HF folder, a .gguf or a registry name")
    p.add_argument("--tokenizer", default="", help="tokenizer folder for random:<shape> ('' = character-level)")
    p.add_argument("--tiny", action="store_true", help="CPU plumbing run: random:tiny, HF engine only, small batch")
    p.add_argument("--engines", default="hf,vllm_colocated", help="comma-separated; hf always runs")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompts", type=int, default=32, help="P: distinct prompts")
    p.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward in the update")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs / torch.compile")
    p.add_argument("--max-num-seqs", type=int, default=0,
                   help="vLLM max_num_seqs (0 = its default: 1024 for the LLM class on a >= 70 GB GPU)")
    p.add_argument("--cudagraph-max", type=int, default=0,
                   help="vLLM max_cudagraph_capture_size (0 = its default min(2 * max_num_seqs, 512): batches "
                        "above 512 sequences then decode without CUDA graphs)")
    p.add_argument("--no-flat-logprobs", action="store_true",
                   help="vLLM's dict + Logprob object per token instead of FlatLogprobs (the old path)")
    p.add_argument("--no-update", action="store_true", help="skip the update timing")
    p.add_argument("--no-sync", action="store_true", help="skip the weight-sync timings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="rollout_bench.json to write")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.tiny:
        args.model, args.engines = "random:tiny", ["hf"]
        args.prompts, args.group, args.max_new_tokens, args.repeats = 2, 4, 16, 2
    try:  # the config's own checks (e.g. a CUDA-graph size vLLM does not capture) before any model loads
        grpo_config(args, "hf")
    except ConfigError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        result = measure(args, Path(tmp))
    result["provenance"] = provenance()
    write_json(args.out, result)
    e = result["engines"]
    print(json.dumps({k: round(v["tokens_per_s"], 1) for k, v in e.items()}), "ratio",
          result["ratio_vllm_over_hf"], "update_ms", result["update_ms"], "vllm", result["vllm_options"]["effective"],
          [(s["label"], round(s["median_ms"], 1)) for s in result["weight_sync"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
