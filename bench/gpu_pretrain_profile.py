"""Where a training step's time goes: GPU kernel time by kind, and how much of the wall clock the GPU is idle.

Builds the trainer exactly as train_gpt.train does (train_gpt.build), runs --warmup steps (compile), times
--timed steps without the profiler (tokens/s as the trainer reports it), then records --steps steps under
torch.profiler and reads the Chrome trace's kernels:
  busy      the union of kernel intervals over the profiled wall clock (below 1: the GPU waits on the host:
            launches, data, .item() syncs);
  idle      the gaps between GPU events by cause: around host-to-device batch copies, after host syncs, short
            launch gaps (< 20 us) and the rest;
  by kind   GEMM (cuBLAS/CUTLASS: bf16 and FP8), attention (SDPA kernels), the Triton loss kernel, fused
            elementwise/reductions (Triton, from torch.compile), copies, collectives, other; the top kernels.
The trace is kept beside the JSON (.trace.json.gz); --from-trace re-reads one (same timings, current binning).

    PYTHONPATH=src python3 bench/gpu_pretrain_profile.py --config configs/pretrain/gpt2-124m-fineweb-edu.toml \\
        --set data.dir=\\"DIR\\" --set train.fp8=\\"all\\" ... --out /tmp/out/profile.json
    python3 bench/gpu_pretrain_profile.py --from-trace results/h200/profile.json   # re-bin a kept trace, no GPU
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.device_batches import DeviceBatches

KINDS = [  # first match wins; names as Inductor (triton_*), cuBLAS (nvjet/xmma), CUTLASS and cuDNN/flash SDPA emit them
    ("loss kernel", re.compile(r"^_ce_(rows|grad_e5m2)")),  # ce_kernel.py (train.loss_kernel="triton*")
    ("gelu kernel", re.compile(r"^_gelu_(grad_)?rows")),     # fp8_kernels.py (train.fp8_gelu_kernel)
    ("triton", re.compile(r"^triton_")),        # before gemm: fused names carry their neighbours' ops (_scaled_mm)
    ("gemm", re.compile(r"nvjet|gemm|xmma|cutlass|matmul", re.I)),
    ("attention", re.compile(r"sdpa|fmha|flash|attn|attention|cudnn_generated", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|cat|fill", re.I)),
    ("collective", re.compile(r"nccl", re.I)),
]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels on several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


IDLE_CAUSES = (  # a gap in GPU activity, named by the GPU events around it (first match wins)
    ("before a batch copy", lambda prev, nxt: nxt.startswith("Memcpy HtoD")),     # the host cuts the batch
    ("after a batch copy", lambda prev, nxt: prev.startswith("Memcpy HtoD")),     # a pageable copy synced the stream
    ("after a host sync", lambda prev, nxt: prev.startswith("Memcpy DtoH")),      # .item(): launches start afresh
)
LAUNCH_GAP_US = 20.0  # shorter gaps between kernels: the launch rate, which CUDA graphs would remove


def idle_by_cause(trace: dict, steps: int) -> dict[str, float]:
    """GPU idle ms per step between the first and the last GPU event, by cause: the gaps around host-to-device
    batch copies and host syncs, short launch gaps, and the rest."""
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                     and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    out: dict[str, float] = defaultdict(float)
    end, last = (events[0]["ts"] + events[0]["dur"], events[0]["name"]) if events else (0.0, "")
    for e in events[1:]:
        gap = e["ts"] - end
        if gap > 0:
            cause = next((c for c, match in IDLE_CAUSES if match(last, e["name"])),
                         "launch gaps" if gap < LAUNCH_GAP_US else "other")
            out[cause] += gap / 1000 / steps
        if e["ts"] + e["dur"] > end:
            end, last = e["ts"] + e["dur"], e["name"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize(trace: dict, wall_s: float, steps: int, top: int) -> dict:
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    per_kind, per_name, threads = defaultdict(float), defaultdict(lambda: [0.0, 0]), {}
    for e in kernels:
        per_kind[kind_of(e["name"])] += e["dur"]
        per_name[e["name"]][0] += e["dur"]
        per_name[e["name"]][1] += 1
        threads.setdefault(e["name"], (e.get("args", {}).get("block") or [None])[0])  # the launch: warps = /32
    busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    ms = lambda us: us / 1000 / steps  # noqa: E731  per optimizer step
    return {
        "profiled_steps": steps, "wall_ms_per_step": 1000 * wall_s / steps, "gpu_busy_ms_per_step": ms(busy),
        "gpu_busy_fraction": busy / (1e6 * wall_s), "kernels_per_step": len(kernels) / steps,
        "idle_ms_per_step_by_cause": idle_by_cause(trace, steps),
        "ms_per_step_by_kind": {k: ms(v) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "ms_per_step": ms(t), "calls_per_step": c / steps,
                         "threads_per_block": threads[n]}
                        for n, (t, c) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def run_steps(n: int, model, optimizer, stream, cfg, device, autocast, accum) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        train_gpt.train_step(model, optimizer, stream, cfg, 1, device, autocast, accum, None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def resummarize(path: Path, top: int) -> int:
    """Rebin the kept trace of an earlier run (its wall clock and step count from its JSON) and rewrite the JSON."""
    result = json.loads(path.read_text())
    with gzip.open(path.with_suffix(".trace.json.gz"), "rt") as f:
        trace = json.load(f)
    steps = result["profiled_steps"]
    result.update(summarize(trace, result["wall_ms_per_step"] * steps / 1000, steps, top))
    path.write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    return 0


def report(result: dict) -> None:
    print(f"{result['tokens_per_s']:,.0f} tok/s unprofiled | profiled {result['wall_ms_per_step']:.1f} ms/step, "
          f"GPU busy {result['gpu_busy_ms_per_step']:.1f} ms ({100 * result['gpu_busy_fraction']:.1f}%), "
          f"{result['kernels_per_step']:.0f} kernels/step")
    for kind, ms in result["ms_per_step_by_kind"].items():
        print(f"  {kind:12s} {ms:8.1f} ms/step")
    for cause, ms in result.get("idle_ms_per_step_by_cause", {}).items():
        print(f"  idle, {cause:20s} {ms:6.2f} ms/step")
    for k in result["top_kernels"]:
        print(f"  {k['ms_per_step']:8.2f} ms  x{k['calls_per_step']:<5.0f} {k.get('threads_per_block') or '':>4} "
              f"{k['name'][:105]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timed", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--from-trace", type=Path, metavar="JSON", help="re-summarize the trace kept beside this result")
    args = ap.parse_args(argv)
    if args.from_trace:
        return resummarize(args.from_trace, args.top)
    if not (args.config and args.out):
        ap.error("--config and --out are needed to profile (or --from-trace to re-read a kept trace)")
    cfg = load_pretrain_config(args.config, args.set)
    device = torch.device("cuda")
    torch.manual_seed(cfg.train.seed)
    model, optimizer, autocast, _, _ = train_gpt.build(cfg, 1, device)
    stream = DeviceBatches(train_gpt.make_stream(cfg, "train", 0, 1), device, cfg.train.batch_prefetch)
    accum = cfg.grad_accum(1)
    step = lambda n: run_steps(n, model, optimizer, stream, cfg, device, autocast, accum)  # noqa: E731
    step(args.warmup)
    timed_s = step(args.timed)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        wall_s = step(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        with gzip.open(args.out.with_suffix(".trace.json.gz"), "wt") as f:
            json.dump(trace, f)
    tok = cfg.train.micro_batch_size * cfg.model.block_size * accum
    result = {"sets": args.set, "tokens_per_step": tok, "timed_steps": args.timed,
              "tokens_per_s": tok * args.timed / timed_s, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), **summarize(trace, wall_s, args.steps,
                                                                                          args.top)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
