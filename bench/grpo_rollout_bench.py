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
Response lengths (--lengths, recorded under "lengths"): random weights never emit EOS, so by default (fixed) every
sequence runs to max_new_tokens, HF generate's best case (a static batch, no finished rows). lognormal and file:PATH
draw one target length L_i per sequence and make each engine pay what an EOS after L_i tokens would cost it: vLLM
decodes L_i tokens for sequence i (one request per sequence), HF decodes max_i L_i for the whole batch and keeps the
first L_i of row i; tokens/s of both = sum_i L_i / wall-clock ("response lengths" below says why and how).
vLLM's tuning options (--max-num-seqs, --cudagraph-max, --no-flat-logprobs) are written to "vllm_options", as
asked and as the engine ran them, so variants (one process each: vLLM does not hand GPU memory back in-process)
can be compared; bench/gpu_grpo.sh PART variants runs a set. --vllm-engines K runs the colocated engine as K
vllm.LLM instances on the GPU, each with a contiguous share of the prompts and its scheduler in a process of its
own (rollout.server.engines; needs --engine-core subprocess); K is recorded as "vllm_engines" and in the
provenance. One K per process, as for the other options. --trace-steps times every engine's front-end steps
(blocked on its engine core vs processing the output, bench/rollout_steps.py) into "step_trace", and writes the call
in flight into the partial file while it runs, so a case cut by its time limit still shows its decode rate.

    # GPU (H200): a random-weight Qwen2.5-1.5B-shaped model with the tokenizer found in --tokenizer
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --out rollout_bench.json
    # a variant: 1,024 sequences with CUDA graphs up to 1,024 (vLLM's default stops at 512), no sync/update timing
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --prompts 64 \
        --group 16 --cudagraph-max 1024 --repeats 2 --no-update --no-sync --out flat-graphs-1024.json
    # emulated long-tailed lengths: lognormal, mean 256, sigma 0.6, clipped to [1, 512]
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --prompts 64 \
        --group 16 --cudagraph-max 1024 --max-new-tokens 512 --lengths lognormal --length-mean 256 \
        --length-sigma 0.6 --repeats 2 --no-update --no-sync --out flat-graphs-1024-lognormal.json
    # the same batch over 4 colocated engines (run K = 1, 2, 4 as one process each)
    python bench/grpo_rollout_bench.py --model random:qwen2.5-1.5b --tokenizer .grpo-gpu/smol --prompts 64 \
        --group 16 --cudagraph-max 1024 --repeats 2 --no-update --no-sync --engine-core subprocess \
        --vllm-engines 4 --out fixed1024-k4.json
    # CPU plumbing: a tiny random Llama, HF engine only, sync into an own HF copy
    python bench/grpo_rollout_bench.py --tiny --out /tmp/rollout_bench.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from scalelab.core.config import ConfigError
from scalelab.core.hfgen import left_pad
from scalelab.core.jsonio import write_json
from scalelab.grpo.advantages import group_advantages
from scalelab.grpo.batch import collate
from scalelab.grpo.completions import repeat_prompts
from scalelab.grpo.config import LoraConfig, load_grpo_config
from scalelab.grpo.engine_hf import HFGenerateEngine
from scalelab.grpo.engine_vllm_colocated import VLLMColocatedEngine
from scalelab.grpo.engine_vllm_multi import MultiColocatedEngine, PromptSlice
from scalelab.grpo.engines import build_engine
from scalelab.grpo.logprobs import sampled_logprobs
from scalelab.grpo.parts import apply_lora, encode_prompt
from scalelab.grpo.types import EngineContext, RolloutBatch, SamplingParams
from scalelab.grpo.weightsync import sync_weights

from rollout_steps import Heartbeat, StepTrace


@dataclass(frozen=True)
class EngineResult:
    tokens_per_s: float  # median run's completion tokens / its wall-clock
    median_ms: float  # the engine's own timing: the generate call of vLLM / HF
    median_call_ms: float  # that run's whole engine.generate (adds the cut at stop tokens, logprob parsing, decode)
    completion_tokens: int  # of the median run, each row cut to its target length: the useful tokens
    computed_tokens: int  # decode positions the engine ran: HF rows x its longest row (padding included), vLLM the sum
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


TASKS = {"arithmetic": ("arithmetic", {"digits": 2}),  # 2-digit sums: answers of a few tokens unless forced
         "gsm8k": ("gsm8k", {"prompt_format": "qwen_boxed"})}  # the GRPO recipe's prompts (needs the data dir)


def make_prompts(tokenizer: object, n: int, seed: int, task: str = "arithmetic") -> list[list[int]]:
    """n training prompts of `task` (TASKS), chat-templated, as token ids."""
    from scalelab.evals.tasks import get_task
    name, options = TASKS[task]
    examples = get_task(name, **options).load("train", limit=n, seed=seed)
    return [encode_prompt(tokenizer, ex.prompt) for ex in examples]


def grpo_config(args: argparse.Namespace, engine: str):
    return load_grpo_config(None, [
        f"rollout.engine={engine}", "model.lora.enabled=false", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"optim.micro_batch_size={args.micro_batch}",
        f"rollout.server.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"rollout.server.max_model_len={args.max_model_len}", f"rollout.server.enforce_eager={str(args.eager).lower()}",
        f"rollout.server.max_num_seqs={args.max_num_seqs}",
        f"rollout.server.max_cudagraph_capture_size={args.cudagraph_max}",
        f"rollout.server.flat_logprobs={str(not args.no_flat_logprobs).lower()}",
        f"rollout.server.engine_core={args.engine_core}", f"rollout.server.engines={args.vllm_engines}",
        "optim.lr=1e-6"])


def build(name: str, model: torch.nn.Module, tokenizer: object, args: argparse.Namespace, method: str,
          workdir: Path, lora_rank: int = 0):
    cfg = grpo_config(args, name)
    return build_engine(name, EngineContext(model, tokenizer, cfg.rollout, lora_rank, method, workdir, args.seed))


# ---------------------------------------------------------------------------------------------
# response lengths
#
# Real GRPO rollouts have long-tailed response lengths: most sequences end early, a few run to the cap, and in a
# synchronous step the batch waits for its longest ones (RollPacker, Gao et al. 2025, arXiv:2509.21009: the
# imbalanced lengths within a rollout step leave GPUs idle). That is where the engines part ways: HF generate
# runs a static batch until its longest row ends, computing the finished rows as padding; vLLM's continuous
# batching drops a sequence when it ends. Random weights never emit EOS, so the bench draws the lengths instead:
# lognormal is our choice of a two-parameter long tail (not a fit to any run); file:PATH resamples lengths
# measured from real rollouts.


@dataclass(frozen=True)
class LengthSpec:
    mode: str  # fixed | lognormal | file (LENGTH_SAMPLERS)
    mean: float = 256.0  # lognormal: mean of the distribution before clipping, tokens
    sigma: float = 0.6  # lognormal: standard deviation of ln L
    path: str = ""  # file: a JSON list of lengths
    source: tuple[int, ...] = ()  # file: the lengths read from it

    def params(self) -> dict:
        return {"lognormal": {"mean": self.mean, "sigma": self.sigma},
                "file": {"path": self.path, "source_count": len(self.source)}}.get(self.mode, {})


@dataclass(frozen=True)
class LengthStats:
    mean: float
    p50: float  # numpy's linearly interpolated percentiles
    p90: float
    max: int
    max_over_mean: float  # the static batch's padding factor: HF computes max per row, on average mean is used
    useful_tokens: int  # sum_i L_i: what every engine is credited with
    padded_tokens: int  # B x max_i L_i: what a static batch (HF generate) computes
    at_cap_frac: float  # drawn at the cap (max_new_tokens): clipped, as a run's truncated responses are


@dataclass(frozen=True)
class SeqRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int  # its target length: with ignore_eos vLLM decodes exactly this many
    seed: int


def read_lengths_file(path: str) -> tuple[int, ...]:
    """A JSON list of response lengths (tokens, >= 0), e.g. measured from real rollouts."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--lengths file:{path}: {e}") from None
    ok = isinstance(data, list) and data and all(isinstance(x, (int, float)) and 0 <= x < math.inf for x in data)
    if not ok:
        raise ValueError(f"--lengths file:{path}: expected a non-empty JSON list of finite lengths >= 0")
    return tuple(int(round(x)) for x in data)


def parse_lengths(text: str, mean: float, sigma: float) -> LengthSpec:
    """--lengths fixed | lognormal | file:PATH (with --length-mean / --length-sigma for lognormal)."""
    if text.startswith("file:"):
        path = text.removeprefix("file:")
        return LengthSpec("file", path=path, source=read_lengths_file(path))
    if text not in LENGTH_SAMPLERS or text == "file":
        raise ValueError(f"--lengths {text!r}; allowed: fixed, lognormal, file:PATH")
    if text == "lognormal" and not (mean > 0 and sigma >= 0):
        raise ValueError(f"--lengths lognormal needs --length-mean > 0 and --length-sigma >= 0 (got {mean:g}, "
                         f"{sigma:g})")
    return LengthSpec(text, mean, sigma)


def _fixed(spec: LengthSpec, count: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    return np.full(count, cap)


def _lognormal(spec: LengthSpec, count: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    # ln L ~ N(mu, sigma^2) with mu = ln(mean) - sigma^2 / 2, so that E[L] = exp(mu + sigma^2 / 2) = mean
    return rng.lognormal(np.log(spec.mean) - spec.sigma ** 2 / 2, spec.sigma, count)


def _resample(spec: LengthSpec, count: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(np.array(spec.source), size=count, replace=True)


LENGTH_SAMPLERS: dict[str, Callable[[LengthSpec, int, int, np.random.Generator], np.ndarray]] = {
    "fixed": _fixed, "lognormal": _lognormal, "file": _resample}


def draw_lengths(spec: LengthSpec, count: int, cap: int, seed: int) -> tuple[int, ...]:
    """`count` target lengths from the bench's own generator, rounded and clipped to [1, cap]."""
    raw = LENGTH_SAMPLERS[spec.mode](spec, count, cap, np.random.default_rng(seed))
    return tuple(int(x) for x in np.clip(np.rint(raw), 1, cap))


def length_stats(lengths: Sequence[int], cap: int) -> LengthStats:
    a = np.asarray(lengths)
    mean = float(a.mean())
    return LengthStats(mean, float(np.percentile(a, 50)), float(np.percentile(a, 90)), int(a.max()),
                       float(a.max()) / mean, int(a.sum()), len(a) * int(a.max()), float((a >= cap).mean()))


def length_requests(prompts: Sequence[Sequence[int]], n: int, lengths: Sequence[int], seed: int) -> list[SeqRequest]:
    """One request per sequence, group-major as the engines order rows (row i*n + j = prompt i's j-th sample).
    Seed seed + j: vLLM seeds the j-th child of an n-sample request with seed + j (vllm/v1/engine/
    parallel_sampling.py), so these are the engine's seeds. The n requests of a prompt carry the same ids, so
    prefix caching shares its KV blocks as it does for the children of one request."""
    rows = repeat_prompts(prompts, n)
    if len(lengths) != len(rows):
        raise ValueError(f"{len(lengths)} lengths for {len(rows)} sequences")
    return [SeqRequest(row, int(length), seed + k % n) for k, (row, length) in enumerate(zip(rows, lengths))]


def keep_first(batch: RolloutBatch, lengths: Sequence[int], decode: Callable[[Sequence[int]], str]) -> RolloutBatch:
    """Row i cut to its first L_i tokens: what the trainer would get had it ended there; a row already shorter (a
    stop token sampled by chance) stays as it is. Texts of cut rows are decoded again."""
    cut = [len(c) > n for c, n in zip(batch.completion_ids, lengths)]
    comps = tuple(c[:n] for c, n in zip(batch.completion_ids, lengths))
    texts = tuple(decode(c) if k else t for c, t, k in zip(comps, batch.texts, cut))
    return replace(batch, completion_ids=comps, texts=texts,
                   logprobs=tuple(lp[:n] for lp, n in zip(batch.logprobs, lengths)))


def computed_tokens(batch: RolloutBatch) -> int:
    """Decode positions the engine ran: HF's static batch runs every row to its longest (finished rows as padding);
    vLLM only runs unfinished sequences."""
    if batch.engine == "hf":
        return len(batch.lengths) * max(batch.lengths, default=0)
    return batch.num_tokens


def vllm_generate_lengths(engine: object, requests: Sequence[SeqRequest], params: SamplingParams) -> RolloutBatch:
    """The colocated engine's `llm` on one request per sequence, max_tokens = its length, ignore_eos and no stop
    ids (so nothing ends it early); otherwise the engine's own sampling options, and its outputs parsed as
    VLLMColocatedEngine.generate parses them (sampled tokens' logprobs, one batch decode). As there, the sampling
    params are built before the timer starts."""
    from vllm import SamplingParams as VllmSampling
    base = engine.sampling_kwargs(params)
    sps = [VllmSampling(**{**base, "n": 1, "max_tokens": r.max_tokens, "seed": r.seed, "ignore_eos": True,
                           "stop_token_ids": []}) for r in requests]
    t0 = time.perf_counter()
    outs = engine.llm.generate([{"prompt_token_ids": list(r.prompt_ids)} for r in requests], sps, use_tqdm=False)
    ms = (time.perf_counter() - t0) * 1e3
    comps, lps, fins = [], [], []
    for out in outs:  # in request order
        c = out.outputs[0]
        ids = list(c.token_ids)
        comps.append(tuple(ids))
        lps.append(tuple(sampled_logprobs(ids, c.logprobs)))
        fins.append(c.finish_reason == "stop")
    texts = tuple(engine.decode_batch([list(c) for c in comps]))
    return RolloutBatch(tuple(r.prompt_ids for r in requests), tuple(comps), texts, tuple(lps), tuple(fins), ms,
                        engine.weights_version, engine.name)


# ---------------------------------------------------------------------------------------------
# the standalone ceiling


class StandaloneVLLM:
    """`vllm.LLM(...).generate` as a user writes it, the ceiling of the colocated engine: the same model folder,
    memory share, context, seed, prompts and sampling (n, temperature, top_p, max_tokens, stop ids), and vLLM's
    defaults otherwise: no logprobs and its own detokenizer. It runs in a process of its own (--engines
    hf,vllm_standalone), as vLLM does not hand its GPU memory back within a process."""
    name = "vllm_standalone"

    def __init__(self, model_dir: Path, stop_ids: Sequence[int], args: argparse.Namespace):
        from vllm import LLM
        self.stop_ids = list(stop_ids)
        self.llm = LLM(model=str(model_dir), dtype="bfloat16", seed=args.seed, max_model_len=args.max_model_len,
                       gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=True)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        from vllm import SamplingParams as VllmSampling
        sp = VllmSampling(n=params.n, temperature=params.temperature, top_p=params.top_p,
                          max_tokens=params.max_new_tokens, seed=params.seed, stop_token_ids=self.stop_ids)
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sp, use_tqdm=False)
        ms = (time.perf_counter() - t0) * 1e3
        rows = [c for out in outs for c in sorted(out.outputs, key=lambda c: c.index)]
        return RolloutBatch(tuple(repeat_prompts(prompts, params.n)), tuple(tuple(c.token_ids) for c in rows),
                            tuple(c.text for c in rows), tuple(() for _ in rows),
                            tuple(c.finish_reason == "stop" for c in rows), ms, 0, self.name)

    def close(self) -> None:
        del self.llm


class HFWithoutLogits(HFGenerateEngine):
    """HF generate at its best: the trainer's HF engine with output_logits off, so no (N, T, V) fp32 copy of every
    step's logits is kept (the engine keeps them for the behaviour log-probs; at 512 sequences x 512 tokens x
    151,936 that alone is 159 GB). Its rows carry zeros for log-probs: a speed baseline only."""

    def _generation_config(self, params: SamplingParams) -> object:
        config = super()._generation_config(params)
        config.output_logits = False
        return config

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutBatch:
        t0 = time.perf_counter()
        rows = repeat_prompts(prompts, params.n)
        ids, mask = left_pad(rows, self.pad_id, next(self.model.parameters()).device)
        new = self._sample(ids, mask, params).sequences[:, ids.shape[1]:].tolist()
        return self._batch(rows, new, [[0.0] * len(r) for r in new], (time.perf_counter() - t0) * 1e3)


def build_standalone(model: torch.nn.Module, tokenizer: object, args: argparse.Namespace,
                     workdir: Path) -> StandaloneVLLM:
    from scalelab.core.hfgen import stop_token_ids
    from scalelab.grpo.weightsync import write_model_folder
    write_model_folder(model, tokenizer, workdir / "standalone-model", next(model.parameters()).dtype)
    return StandaloneVLLM(workdir / "standalone-model", stop_token_ids(model, tokenizer), args)


def profile_call(generate: "Generate", prompts: list[list[int]], params: SamplingParams, path: str) -> dict:
    """One more generate call under cProfile (after the timed ones, so they are not slowed): the Python functions
    by own time, to tell a CPU-bound decode loop (scheduler, output processing) from a GPU-bound one (time spent
    waiting on the device in a synchronizing copy). Written as text to `path`; the top rows are returned."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(generate, prompts, params)
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).sort_stats("tottime")
    stats.print_stats(40)
    Path(path).write_text(f"wall {wall:.3f} s under cProfile\n" + buf.getvalue())
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]
    return {"wall_s": wall, "path": path,
            "top_tottime": [{"function": f"{Path(f).name}:{line}({name})", "calls": nc, "tottime_s": tt,
                             "share": tt / wall} for (f, line, name), (cc, nc, tt, ct, _) in rows]}


# ---------------------------------------------------------------------------------------------
# measure


Generate = Callable[[list[list[int]], SamplingParams], RolloutBatch]  # engine.generate or a stand-in


def timed_generate(generate: Generate, prompts: list[list[int]], params: SamplingParams) -> tuple:
    """(batch, ms of the whole generate call)."""
    t0 = time.perf_counter()
    batch = generate(prompts, params)
    return batch, (time.perf_counter() - t0) * 1e3


def time_engine(generate: Generate, prompts: list[list[int]], params: SamplingParams, repeats: int,
                lengths: Sequence[int], decode: Callable[[Sequence[int]], str]) -> tuple:
    """(EngineResult, the last batch cut to `lengths`): one untimed call on the whole batch, then `repeats` timed
    calls. Tokens/s counts each row's first L_i tokens only (keep_first) over the generate call's wall-clock.
    The warm-up has the timed calls' shapes: a first large batch pays allocator growth and kernel selection
    (measured on an H200: HF generate's first 1,024-sequence batch took 21.9 s, the next 7.4 s)."""
    generate(prompts, params)
    runs, call_ms = zip(*[timed_generate(generate, prompts, params) for _ in range(repeats)])
    ms = [b.generation_ms for b in runs]
    mid = sorted(range(len(runs)), key=lambda i: ms[i])[len(runs) // 2]
    b = runs[mid]
    useful = keep_first(b, lengths, decode).num_tokens
    result = EngineResult(useful / (b.generation_ms / 1e3), b.generation_ms, call_ms[mid], useful,
                          computed_tokens(b), tuple(ms), sum(b.finished) / len(b.finished))
    return result, keep_first(runs[-1], lengths, decode)


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
    if any(e.startswith("vllm") for e in args.engines) and need > args.max_model_len:
        raise SystemExit(f"--max-model-len {args.max_model_len} is below the longest prompt ({longest} tokens) + "
                         f"--max-new-tokens ({args.max_new_tokens}) = {need}; raise --max-model-len")


def check_hf_memory(sequences: int, new_tokens: int, vocab_size: int, free_bytes: int) -> None:
    """HF generate keeps every step's fp32 logits, (N, T, V) x 4 bytes, to score the sampled tokens; refuse a batch
    whose logits alone take > 90% of the free GPU memory (the KV cache needs the rest) before it runs out."""
    need = sequences * new_tokens * vocab_size * 4
    if need > 0.9 * free_bytes:
        raise SystemExit(f"HF generate would keep {need / 1e9:.0f} GB of logits ({sequences} sequences x {new_tokens} "
                         f"tokens x {vocab_size} x 4 B), {free_bytes / 1e9:.0f} GB free: lower --max-new-tokens")


def vllm_lengths_generate(vllm: object, lengths: Sequence[int], args: argparse.Namespace) -> Generate:
    """engine.generate in the fixed mode (its n-per-prompt requests, as the trainer calls it); else one request per
    sequence with max_tokens = L_i (vllm_generate_lengths), on several engines split as their generate splits."""
    if args.length_spec.mode == "fixed":
        return vllm.generate

    def generate(prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        requests = length_requests(prompts, params.n, lengths, params.seed)
        if not isinstance(vllm, MultiColocatedEngine):
            return vllm_generate_lengths(vllm, requests, params)

        def part(engine: VLLMColocatedEngine, s: PromptSlice) -> RolloutBatch:
            rows = s.rows(params.n)
            return vllm_generate_lengths(engine, requests[rows.start:rows.stop], params)
        return vllm.run_split(part, len(prompts))
    return generate


def measure_engines(model: torch.nn.Module, tokenizer: object, prompts: list[list[int]], params: SamplingParams,
                    lengths: Sequence[int], args: argparse.Namespace,
                    workdir: Path) -> tuple[dict, object, object, dict | None]:
    """({engine: EngineResult}, the vLLM engine or None, the last batch, the --profile summary or None). HF first:
    the same-run baseline; it generates the longest target length for the whole batch (what an EOS-terminated
    static batch costs)."""
    engines = {}
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    hf = build("hf", model, tokenizer, args, "shared", workdir / "hf")
    if args.hf_logprobs == "none":
        hf = HFWithoutLogits(model, tokenizer, hf.stop_ids, hf.sync_methods)
    hf_params = replace(params, max_new_tokens=max(lengths))
    engines["hf"], batch = time_engine(hf.generate, prompts, hf_params, args.repeats, lengths, decode)
    write_partial(args, {"engines": {"hf": asdict(engines["hf"])}})
    vllm, generate, profile = None, None, None
    if torch.cuda.is_available() and len(args.engines) > 1:  # HF's cached blocks: vLLM asks for its share of the
        torch.cuda.empty_cache()                             # *free* memory
    if "vllm_colocated" in args.engines:
        vllm = build("vllm_colocated", model, tokenizer, args, "inplace", workdir / "vllm")
        generate = vllm_lengths_generate(vllm, lengths, args)
    elif "vllm_standalone" in args.engines:
        vllm = build_standalone(model, tokenizer, args, workdir)
        generate = vllm.generate
    if generate is not None:
        timed = traced(generate, vllm, args) if args.trace_steps else generate
        engines[vllm.name], batch = time_engine(timed, prompts, params, args.repeats, lengths, decode)
        if args.profile:  # untraced: the profiled call's slower steps stay out of step_trace
            profile = profile_call(generate, prompts, params, args.profile)
    return engines, vllm, batch, profile


def vllm_instances(vllm: object) -> list:
    """The vllm.LLM objects behind an engine: one per sub-engine of a MultiColocatedEngine, else its own."""
    return [e.llm for e in vllm.engines] if isinstance(vllm, MultiColocatedEngine) else [vllm.llm]


def traced(generate: Generate, vllm: object, args: argparse.Namespace) -> Generate:
    """`generate` with --trace-steps: every call's front-end steps per engine (rollout_steps.StepTrace) kept in
    the result's "step_trace" (the warm-up call first), the call in flight written to the partial file every
    --heartbeat-s seconds and when the case is interrupted, so a case cut by its time limit still shows its rate."""
    trace, calls = StepTrace(), []
    for llm in vllm_instances(vllm):
        trace.attach(llm)
    args.step_trace = {"engines": len(trace.engines), "calls": calls}

    def in_flight(t0: float) -> None:
        write_partial(args, {"step_trace": {**args.step_trace, "in_flight": {
            "elapsed_s": time.perf_counter() - t0, "engines": trace.summary()}}})

    def call(prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        trace.reset()
        t0 = time.perf_counter()
        try:
            with Heartbeat(lambda: in_flight(t0), args.heartbeat_s):
                batch = generate(prompts, params)
        except KeyboardInterrupt:
            in_flight(t0)
            raise
        calls.append({"elapsed_s": time.perf_counter() - t0, "engines": trace.summary()})
        return batch
    return call


def partial_path(out: str | Path) -> Path:
    """Where a case keeps what it has measured before its end: `<out stem>.partial.json`, removed once <out> is
    written. A case cut by its time limit during vLLM's repeats then still returns its HF baseline."""
    out = Path(out)
    return out.with_name(out.stem + ".partial.json")


def write_partial(args: argparse.Namespace, measured: dict) -> None:
    """Add `measured` to what the case has written to its partial file so far (top-level keys replaced)."""
    if getattr(args, "out", None):
        args.partial = {**getattr(args, "partial", {}), **measured}
        write_json(partial_path(args.out), {"partial": "the case ended before its file was written; this is what it "
                                                       "had measured", **args.partial,
                                            "provenance": provenance(args.vllm_engines)})


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
             "gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": args.max_model_len,
             "engine_core": args.engine_core}
    return {"requested": asked, "effective": vllm.describe() if vllm is not None else None}


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    model, tokenizer, desc = load_model(args)
    prompts = make_prompts(tokenizer, args.prompts, args.seed, args.task)
    check_context(prompts, args)
    lengths = draw_lengths(args.length_spec, args.prompts * args.group, args.max_new_tokens, args.seed)
    if next(model.parameters()).is_cuda and args.hf_logprobs == "keep":
        check_hf_memory(len(lengths), max(lengths), desc["vocab_size"], torch.cuda.mem_get_info()[0])
    params = SamplingParams(args.group, args.temperature, args.top_p, args.max_new_tokens, args.seed)
    engines, vllm, batch, profile = measure_engines(model, tokenizer, prompts, params, lengths, args, workdir)
    update_ms = None if args.no_update else time_update(model, tokenizer, batch, args)
    colocated = vllm if isinstance(vllm, (VLLMColocatedEngine, MultiColocatedEngine)) else None
    options = vllm_options(args, colocated)
    syncs = [] if args.no_sync else measure_syncs(model, tokenizer, colocated, args, workdir)
    if vllm is not None:
        vllm.close()
    hf_tps, v = engines["hf"].tokens_per_s, engines.get("vllm_colocated") or engines.get("vllm_standalone")
    return {"model": desc, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else
            platform.processor() or "cpu",
            "batch": {"prompts": args.prompts, "group_size": args.group, "sequences": args.prompts * args.group,
                      "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
                      "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p},
            "lengths": {"mode": args.length_spec.mode, "params": args.length_spec.params(), "seed": args.seed,
                        "emulated": args.length_spec.mode != "fixed",
                        **asdict(length_stats(lengths, args.max_new_tokens))},
            "task": args.task, "answer_lengths": asdict(length_stats(batch.lengths, args.max_new_tokens)),
            "engines": {k: asdict(e) for k, e in engines.items()}, "baseline": "hf",
            "ratio_vllm_over_hf": None if v is None else v.tokens_per_s / hf_tps, "update_ms": update_ms,
            "vllm_engines": args.vllm_engines, "vllm_options": options, "weight_sync": [asdict(s) for s in syncs],
            "profile": profile, **({"step_trace": args.step_trace} if getattr(args, "step_trace", None) else {})}


def provenance(vllm_engines: int = 1) -> dict:
    import transformers
    from scalelab.core.provenance import git_sha
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
           "command": " ".join(sys.argv), "unix_time": time.time(), "git_sha": git_sha(),
           # 1: vLLM's engine core in a child process (its default), 0: in this process (the colocated engine's)
           "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
           "vllm_engines": vllm_engines,  # colocated vllm.LLM instances sharing the GPU (--vllm-engines)
           "switch_interval_s": sys.getswitchinterval()}  # the GIL's hand-over interval (--switch-interval-ms)
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
    p.add_argument("--engines", default="hf,vllm_colocated",
                   help="comma-separated; hf always runs, then vllm_colocated or vllm_standalone (one per process)")
    p.add_argument("--task", choices=sorted(TASKS), default="arithmetic",
                   help="the prompts: 2-digit sums, or GSM8K train in the recipe's boxed format (a real model's "
                        "answer lengths; the data from $SCALELAB_SHARED_DATA)")
    p.add_argument("--hf-logprobs", choices=("keep", "none"), default="keep",
                   help="keep: the trainer's HF engine (every step's logits kept for the sampled tokens' "
                        "log-probs); none: generate alone, HF's best case")
    p.add_argument("--profile", default="", help="write a cProfile of one more vLLM call to this text file")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompts", type=int, default=32, help="P: distinct prompts")
    p.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the cap: drawn lengths are clipped to it")
    p.add_argument("--lengths", default="fixed",
                   help="fixed (every sequence runs to --max-new-tokens), lognormal (one length per sequence, "
                        "seeded) or file:PATH (a JSON list of lengths, resampled with the seed)")
    p.add_argument("--length-mean", type=float, default=256.0, help="lognormal: mean length before clipping")
    p.add_argument("--length-sigma", type=float, default=0.6, help="lognormal: standard deviation of ln(length)")
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
    p.add_argument("--engine-core", choices=("inprocess", "subprocess"), default="inprocess",
                   help="where vLLM's engine core runs (rollout.server.engine_core)")
    p.add_argument("--vllm-engines", type=int, default=1,
                   help="K colocated vllm.LLM instances on the GPU, each with 1/K of the prompts and of "
                        "--gpu-memory-utilization and its scheduler in a process of its own "
                        "(rollout.server.engines; needs --engine-core subprocess)")
    p.add_argument("--trace-steps", action="store_true",
                   help="time each vLLM engine's front-end steps (blocked on the engine core vs processing its "
                        "output; bench/rollout_steps.py) into \"step_trace\"")
    p.add_argument("--heartbeat-s", type=float, default=15.0,
                   help="with --trace-steps: how often the call in flight is written to the partial file")
    p.add_argument("--switch-interval-ms", type=float, default=0.0,
                   help="Python's GIL switch interval for this run (0 = the default 5 ms): a shorter one hands the "
                        "GIL to a front end's socket thread sooner")
    p.add_argument("--no-update", action="store_true", help="skip the update timing")
    p.add_argument("--no-sync", action="store_true", help="skip the weight-sync timings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="rollout_bench.json to write")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - {"hf", "vllm_colocated", "vllm_standalone"}
    if unknown or {"vllm_colocated", "vllm_standalone"} <= set(args.engines):
        p.error(f"--engines {','.join(args.engines)}: hf plus at most one of vllm_colocated, vllm_standalone")
    if args.vllm_engines > 1 and "vllm_standalone" in args.engines:
        p.error(f"--vllm-engines {args.vllm_engines}: the colocated engine's; vllm_standalone is one vllm.LLM")
    if args.tiny:
        args.model, args.engines = "random:tiny", ["hf"]
        args.prompts, args.group, args.max_new_tokens, args.repeats = 2, 4, 16, 2
    try:  # the config's own checks (e.g. a CUDA-graph size vLLM does not capture) before any model loads
        grpo_config(args, "hf")
        args.length_spec = parse_lengths(args.lengths, args.length_mean, args.length_sigma)
    except (ConfigError, ValueError) as e:
        p.error(str(e))
    return args


def summary_lines(result: dict) -> list[str]:
    """The run in two lines: tokens/s, ratio, update, options, syncs; then what the lengths were."""
    e, n = result["engines"], result["lengths"]
    first = " ".join(map(str, [json.dumps({k: round(v["tokens_per_s"], 1) for k, v in e.items()}), "ratio",
                               result["ratio_vllm_over_hf"], "update_ms", result["update_ms"], "vllm",
                               result["vllm_options"]["effective"],
                               [(s["label"], round(s["median_ms"], 1)) for s in result["weight_sync"]]]))
    a = result["answer_lengths"]
    first += (f"\nanswers as generated: mean {a['mean']:.0f} p50 {a['p50']:.0f} p90 {a['p90']:.0f} max {a['max']}, "
              f"{100 * a['at_cap_frac']:.1f}% at the cap")
    if result.get("profile"):
        top = result["profile"]["top_tottime"][:6]
        first += "\nprofile (own time / wall): " + "; ".join(f"{r['function']} {100 * r['share']:.0f}%" for r in top)
    if not n["emulated"]:
        return [first, f"lengths fixed: sequences run to max_new_tokens {result['batch']['max_new_tokens']} unless "
                       "they sample a stop token (random weights next to never do; finished_frac says): HF "
                       "generate's best case, no finished rows"]
    params = ", ".join(f"{k} {v}" for k, v in n["params"].items())
    return [first, f"lengths EMULATED ({n['mode']}: {params}; seed {n['seed']}, clipped to [1, "
                   f"{result['batch']['max_new_tokens']}]): each sequence stops after its drawn length L (vLLM "
                   f"max_tokens = L, HF runs the batch to max L); L mean {n['mean']:.0f} p50 {n['p50']:.0f} p90 "
                   f"{n['p90']:.0f} max {n['max']} (max/mean {n['max_over_mean']:.2f}); tokens/s count useful "
                   f"tokens sum L = {n['useful_tokens']:,}; HF computed {e['hf']['computed_tokens']:,} "
                   f"(B x max L = {n['padded_tokens']:,})"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        result = measure(args, Path(tmp))
    result["provenance"] = provenance(args.vllm_engines)
    write_json(args.out, result)
    partial_path(args.out).unlink(missing_ok=True)
    print("\n".join(summary_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
