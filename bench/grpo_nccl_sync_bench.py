"""Trainer -> vLLM server weight sync on two GPUs: NCCL broadcast (rollout.weight_sync 'nccl') vs a safetensors
folder the server reloads in place (reload_rpc), into one server, written as nccl_sync_bench.json.

The trainer's copy of a random-weight model (grpo.randmodel, bf16) sits on cuda:0 of this process; the GRPO job's
own server engine (VLLMServerEngine, which writes the same weights as its model folder and starts the server with
--weight-transfer-config, so both methods work on it) runs on --server-gpu. Per method: one untimed sync
(first_ms; for nccl it forms the group), then --repeats timed syncs of the same weights. ms per sync is
sync_weights' own timing: gather the merged weights, move them, the server's load and prefix-cache reset.

Correctness, per method: greedy completions of fixed prompts with the original weights (A); every weight
perturbed, w += noise * std(w) * N(0, 1) (seeded), and synced: the server's tokens or logprobs must differ from
A's, and its logprobs must match the trainer's HF forward of the perturbed weights on the same tokens within
--tol (bf16 on both sides; a tensor the server did not take, e.g. a tied head, shows here); the original weights
synced back: A's tokens again, logprobs within 1e-3. Across methods ("agreement"): every method perturbs the same
weights with the same seed, so the server's output after NCCL must equal its output after the file reload (vLLM's
own loader), tokens and logprobs within 1e-3: in a deep bf16 model the HF comparison alone cannot tell a sync
fault from the two engines' forward gap.

    # 2 GPUs, vLLM 0.26 importable in this process (the server inherits PYTHONPATH); SmolLM2's tokenizer folder
    PYTHONPATH=$PWD/src:$PWD:/tmp/site:/tmp/vllm-site/site python3 bench/grpo_nccl_sync_bench.py \\
        --tokenizer .grpo-gpu/smol --out /tmp/out/nccl_sync_bench.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from scalelab.core.config import ConfigError
from scalelab.core.jsonio import write_json
from scalelab.grpo.config import load_grpo_config
from scalelab.grpo.engines import build_engine
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import sync_weights

METHODS = ("nccl", "safetensors")
PROMPTS = ("What is 12 + 7?", "Name three colours.", "Count from one to five:", "The capital of France is")
RESTORED_TOL = 1e-3  # same weights, same batch: only kernel nondeterminism may remain


@dataclass(frozen=True)
class SyncTiming:
    method: str
    bytes: int
    first_ms: float  # the untimed first sync (nccl: forming the group included)
    median_ms: float
    runs_ms: tuple[float, ...]
    gb_per_s: float  # bytes / median, 1e9 B/s


@dataclass(frozen=True)
class SyncCheck:
    method: str
    changed: bool  # the perturbed weights' greedy tokens or logprobs differ from the original's
    max_hf_logprob_err: float  # server vs the trainer's HF forward of the perturbed weights, same tokens
    restored_tokens_equal: bool  # the original weights synced back give the original greedy tokens
    max_restored_logprob_diff: float
    ok: bool


# ---------------------------------------------------------------------------------------------
# setup


def grpo_config(args: argparse.Namespace) -> Any:
    return load_grpo_config(None, [
        "rollout.engine=vllm_server", "rollout.weight_sync=nccl", "model.lora.enabled=false", "train.device=cuda",
        f"rollout.server.gpus={json.dumps(args.server_gpu)}", f"rollout.server.python={json.dumps(args.server_python)}",
        'rollout.server.full_sync="reload_rpc"', f"rollout.server.max_model_len={args.max_model_len}",
        f"rollout.server.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.server.enforce_eager={str(args.eager).lower()}"])


def load_policy(args: argparse.Namespace) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoTokenizer
    from scalelab.grpo.randmodel import char_tokenizer, random_model
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else char_tokenizer()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return random_model(args.shape, tokenizer, torch.bfloat16, "cuda:0", args.seed), tokenizer


# ---------------------------------------------------------------------------------------------
# measure


def time_method(method: str, model: Any, engine: Any, repeats: int, versions: Iterator[int],
                workdir: Path) -> SyncTiming:
    recs = [sync_weights(method, model, engine, next(versions), workdir) for _ in range(repeats + 1)]
    runs = tuple(r.sync_ms for r in recs[1:])
    median = statistics.median(runs)
    return SyncTiming(method, recs[-1].bytes, recs[0].sync_ms, median, runs, recs[-1].bytes / (median / 1e3) / 1e9)


def greedy(engine: Any, prompts: list[list[int]], args: argparse.Namespace) -> RolloutBatch:
    return engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=args.new_tokens))


def hf_logprob_error(model: Any, batch: RolloutBatch) -> float:
    """max |server logprob - log softmax of the trainer's forward| over the batch's completion tokens (greedy:
    the untempered policy, as vLLM reports it)."""
    worst = 0.0
    with torch.no_grad():
        for p, c, lp in zip(batch.prompt_ids, batch.completion_ids, batch.logprobs):
            if not c:
                continue
            ids = torch.tensor([list(p) + list(c)], device="cuda:0")
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()  # (len(c), V)
            ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(p):, None])[:, 0]
            worst = max(worst, float((torch.tensor(lp, device="cuda:0") - ref).abs().max()))
    return worst


def perturb(model: Any, noise: float, seed: int) -> list[torch.Tensor]:
    """w += noise * std(w) * N(0, 1) on every weight (norm weights, all ones, stay); returns the originals."""
    saved = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator(device="cuda:0").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            z = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            p.add_((z * p.float().std() * noise).to(p.dtype))
    return saved


@dataclass(frozen=True)
class Agreement:
    """The server's greedy output on the same perturbed weights, synced by `method` and by `reference` (the file
    reload, vLLM's own loader): equal outputs mean the sync delivered the weights the loader would have, which the
    HF comparison cannot tell apart from a bf16 gap between HF's and vLLM's forward in a deep model."""
    method: str
    reference: str
    tokens_equal: bool
    max_logprob_diff: float  # over the tokens both produced, position by position
    ok: bool


def max_logprob_diff(a: RolloutBatch, b: RolloutBatch) -> float:
    """Largest |logprob difference| over the tokens both batches produced, position by position."""
    return max((abs(p - q) for x, y in zip(a.logprobs, b.logprobs) for p, q in zip(x, y)), default=0.0)


def agreement(method: str, batch: RolloutBatch, reference: str, ref: RolloutBatch) -> Agreement:
    same, diff = batch.completion_ids == ref.completion_ids, max_logprob_diff(batch, ref)
    return Agreement(method, reference, same, diff, same and diff <= RESTORED_TOL)


def check_method(method: str, model: Any, engine: Any, prompts: list[list[int]], args: argparse.Namespace,
                 versions: Iterator[int], workdir: Path) -> tuple[SyncCheck, RolloutBatch]:
    """The check, and the server's greedy output on the perturbed weights (for the cross-method agreement)."""
    sync_weights(method, model, engine, next(versions), workdir)  # the original weights, by this method
    original = greedy(engine, prompts, args)
    saved = perturb(model, args.noise, args.seed + 1)
    sync_weights(method, model, engine, next(versions), workdir)
    changed = greedy(engine, prompts, args)
    err = hf_logprob_error(model, changed)
    with torch.no_grad():
        for p, s in zip(model.parameters(), saved):
            p.copy_(s)
    sync_weights(method, model, engine, next(versions), workdir)
    back = greedy(engine, prompts, args)
    differs = changed.completion_ids != original.completion_ids or changed.logprobs != original.logprobs
    same_tokens = back.completion_ids == original.completion_ids
    diff = max_logprob_diff(back, original)
    ok = differs and err <= args.tol and same_tokens and diff <= RESTORED_TOL
    return SyncCheck(method, differs, err, same_tokens, diff, ok), changed


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    model, tokenizer = load_policy(args)
    cfg = grpo_config(args)
    engine = build_engine("vllm_server", EngineContext(model, tokenizer, cfg.rollout, 0, "nccl", workdir, args.seed))
    prompts = [tokenizer.encode(t) for t in PROMPTS]
    versions = itertools.count(1)
    try:  # timings first, so nccl's first sync is the one that forms the group
        timings = [time_method(m, model, engine, args.repeats, versions, workdir / "sync") for m in args.methods]
        checked = {m: check_method(m, model, engine, prompts, args, versions, workdir / "sync") for m in args.methods}
        server = engine.describe()
    finally:
        engine.close()
    return {"model": {"shape": args.shape, "tokenizer": args.tokenizer or "character-level", "dtype": "bfloat16",
                      "n_params": sum(p.numel() for p in model.parameters()),
                      "tied_embeddings": bool(model.config.tie_word_embeddings)},
            "devices": {"trainer": torch.cuda.get_device_name(0), "server_gpus": args.server_gpu},
            "noise": args.noise, "tol": args.tol, "timings": [asdict(t) for t in timings],
            "checks": [asdict(c) for c, _ in checked.values()],
            "agreement": [asdict(agreement(m, checked[m][1], "safetensors", checked["safetensors"][1]))
                          for m in checked if m != "safetensors" and "safetensors" in checked],
            "ok": all(c.ok for c, _ in checked.values()), "server": server}


# ---------------------------------------------------------------------------------------------
# the run


def provenance() -> dict:
    import transformers
    import vllm
    from scalelab.core.provenance import git_sha  # SCALELAB_GIT_SHA when the tree has no .git
    return {"git_sha": git_sha(), "torch": torch.__version__, "transformers": transformers.__version__,
            "vllm": vllm.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "python": sys.version.split()[0], "command": " ".join(sys.argv), "unix_time": time.time()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-1.5b", help="grpo.randmodel.SHAPES name of the random model")
    p.add_argument("--tokenizer", default="", help="tokenizer folder ('' = character-level)")
    p.add_argument("--server-gpu", default="1", help="the server's CUDA_VISIBLE_DEVICES; the trainer uses cuda:0")
    p.add_argument("--server-python", default=sys.executable, help="python that runs vLLM (inherits PYTHONPATH)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of: " + ", ".join(METHODS))
    p.add_argument("--repeats", type=int, default=5, help="timed syncs per method, after one untimed")
    p.add_argument("--noise", type=float, default=0.1, help="the perturbation: w += noise * std(w) * N(0, 1)")
    p.add_argument("--tol", type=float, default=0.1, help="max |server - HF| logprob of the perturbed weights")
    p.add_argument("--new-tokens", type=int, default=16, help="greedy completion length of the checks")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="nccl_sync_bench.json to write")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        p.error(f"--methods {unknown or 'empty'}; allowed: {', '.join(METHODS)}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    try:  # the config's own checks before a model is built
        grpo_config(args)
    except ConfigError as e:
        p.error(str(e))
    return args


def summary_lines(result: dict) -> list[str]:
    checks = {c["method"]: c for c in result["checks"]}
    return [f"{t['method']}: {t['median_ms']:.1f} ms/sync median of {len(t['runs_ms'])} ({t['gb_per_s']:.1f} GB/s, "
            f"{t['bytes'] / 1e9:.2f} GB; first {t['first_ms']:.0f} ms) check "
            f"{'ok' if checks[t['method']]['ok'] else 'FAILED'} (HF err "
            f"{checks[t['method']]['max_hf_logprob_err']:.3f})" for t in result["timings"]] + [
        f"{a['method']} vs {a['reference']}: same tokens {a['tokens_equal']}, max logprob diff "
        f"{a['max_logprob_diff']:.2e} -> {'agree' if a['ok'] else 'DISAGREE'}" for a in result.get("agreement", [])]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from scalelab.grpo.ncclsync import require_nccl
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    trainer_gpu = visible.split(",")[0] if visible else "0"
    try:
        require_nccl()
        if trainer_gpu in args.server_gpu.split(","):
            raise ConfigError(f"--server-gpu {args.server_gpu} holds the trainer's GPU ({trainer_gpu}); NCCL puts "
                              "one rank per GPU")
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="nccl-sync-bench-") as tmp:
        result = measure(args, Path(tmp))
    result["provenance"] = provenance()
    write_json(args.out, result)
    print("\n".join(summary_lines(result)))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
