#!/usr/bin/env python
"""Collective bandwidth and latency across message sizes, with nccl-tests conventions; torch.distributed only.

    torchrun --nproc_per_node 2 bench/nccl_bench.py --out results/h200/nccl_collectives.json
    torchrun --nproc_per_node 2 bench/nccl_bench.py --backend gloo --max-bytes 1048576 --out /tmp/gloo.json
    torchrun --nproc_per_node 2 bench/nccl_bench.py --tp-forward --out results/h200/tp_forward_qwen7b.json

Collectives mode: all-reduce, all-gather, reduce-scatter and all-to-all at sizes 8 B .. 1 GiB (x2 steps by
default). Size S is what nccl-tests reports (doc/PERFORMANCE.md): the all-reduce buffer, the all-gather's
*output*, the reduce-scatter's *input*, the all-to-all buffer per rank. Each size gets warm-up calls, then
`--repeats` timings of `--iters` back-to-back calls (CUDA events on GPU, perf_counter after a barrier on
CPU); we keep the median per rank and report the slowest rank. algbw = S/t; busbw = algbw x 2(n-1)/n for
all-reduce and (n-1)/n for the others.

TP-forward mode: a Megatron-style tensor-parallel forward of a stack of transformer layers (column-parallel
QKV and gate/up, row-parallel output and down projections, one all-reduce after each; Shoeybi et al. 2019),
with random bf16 weights, timed with and without its all-reduces. Compare with
`scalelab calc train --forward-only --no-head --tp 2 ...` (docs/calc.md, "H200 calibration").

The output JSON carries provenance (GPU, torch/NCCL/CUDA versions, git sha, NCCL_*/NVSHMEM_* environment, the
exact command). Stdlib + torch only, so it runs where scalelab is not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

# NVLink multicast must stay off on the shared H200 machines (a program using it can take the host's GPUs out
# of service): NCCL's NVLS algorithms, PyTorch's symmetric-memory multicast and NVSHMEM's. Set before torch loads.
for _var in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
    os.environ.setdefault(_var, "0" if _var == "NCCL_NVLS_ENABLE" else "1")

import torch                        # noqa: E402  (after the environment is set)
import torch.distributed as dist    # noqa: E402

# torch 2.13 renames all_gather_into_tensor/reduce_scatter_tensor; the old names work on 2.11-2.13 alike
warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use.*", category=FutureWarning)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bus_factor(name: str, n: int) -> float:
    return 2.0 * (n - 1) / n if name == "all_reduce" else (n - 1) / n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file written by rank 0")
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=2**30)
    p.add_argument("--step", type=int, default=2, help="size multiplier between points (2 or 4)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="back-to-back calls per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per size; the median is kept")
    p.add_argument("--tp-forward", action="store_true", help="time a TP forward of a layer stack instead")
    p.add_argument("--hidden", type=int, default=3584, help="tp-forward: d_model (default Qwen2.5-7B)")
    p.add_argument("--ffn", type=int, default=18944, help="tp-forward: SwiGLU hidden width")
    p.add_argument("--heads", type=int, default=28)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# setup and provenance


def init(backend: str) -> tuple[int, int, torch.device]:
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def git_sha() -> str:
    if os.environ.get("SCALELAB_GIT_SHA"):  # a copy of the tree without .git (e.g. a lent GPU machine)
        return os.environ["SCALELAB_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(world: int, device: torch.device) -> dict:
    nproc = os.environ.get("LOCAL_WORLD_SIZE", str(world))
    info = {"git_sha": git_sha(), "host": socket.gethostname(), "time_unix": time.time(),
            "command": f"torchrun --nproc_per_node {nproc} " + " ".join(sys.argv),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM"))}}
    if device.type == "cuda":
        v = torch.cuda.nccl.version()
        info.update(gpu=torch.cuda.get_device_name(device), gpu_count=torch.cuda.device_count(),
                    cuda=torch.version.cuda, nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    return info


# ---------------------------------------------------------------------------------------------
# timing


def time_calls(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of `iters` back-to-back calls of `fn`, on this rank."""
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def slowest_median(times: list[float], device: torch.device) -> float:
    """Median over repeats on this rank, then the maximum over ranks (the collective ends with the last)."""
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(fn, args: argparse.Namespace, device: torch.device, iters: int) -> tuple[float, list[float]]:
    for _ in range(args.warmup):
        fn()
    times = [time_calls(fn, iters, device) for _ in range(args.repeats)]
    return slowest_median(times, device), times


# ---------------------------------------------------------------------------------------------
# collectives


def make_op(name: str, size_bytes: int, world: int, device: torch.device, dtype: torch.dtype):
    """The call and the size it really moves (rounded to whole elements, divisible by the world size)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    count = max(size_bytes // elem, 1)
    if name != "all_reduce":
        count = max(world, count // world * world)
    full = torch.zeros(count, dtype=dtype, device=device)       # zeros: repeated sums never overflow
    part = torch.zeros(count // world, dtype=dtype, device=device)
    out = torch.empty_like(full)
    ops = {"all_reduce": lambda: dist.all_reduce(full),
           "all_gather": lambda: dist.all_gather_into_tensor(full, part),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
           "all_to_all": lambda: dist.all_to_all_single(out, full)}
    return ops[name], count * elem


def sizes(args: argparse.Namespace) -> list[int]:
    out, s = [], args.min_bytes
    while s <= args.max_bytes:
        out.append(s)
        s *= args.step
    return out


def run_collectives(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> dict:
    dtype = DTYPES[args.dtype]
    rows = []
    for name in args.collectives.split(","):
        for size in sizes(args):
            fn, nbytes = make_op(name, size, world, device, dtype)
            t, times = measure(fn, args, device, args.iters)
            algbw = nbytes / t
            rows.append({"collective": name, "size_bytes": nbytes, "time_s": t, "times_s_rank0": times,
                         "algbw_gb_s": algbw / 1e9, "busbw_gb_s": algbw * bus_factor(name, world) / 1e9})
            if rank == 0:
                print(f"{name:15s} {nbytes:>12d} B  {t * 1e6:10.1f} us  algbw {algbw / 1e9:8.2f}  "
                      f"busbw {rows[-1]['busbw_gb_s']:8.2f} GB/s", flush=True)
    return {"schema": "scalelab.nccl_bench/1", "mode": "collectives", "backend": args.backend, "world_size": world,
            "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters, "repeats": args.repeats,
            "results": rows}


# ---------------------------------------------------------------------------------------------
# tensor-parallel forward of a layer stack


def tp_layers(args: argparse.Namespace, world: int, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Random weights of this rank's shard of each layer: heads and FFN columns split over the TP ranks."""
    hd = args.hidden // args.heads
    q, kv, f = args.heads // world * hd, max(args.kv_heads // world, 1) * hd, args.ffn // world
    gen = torch.Generator(device=device).manual_seed(1234)     # on the device: ~1e9 weights, no host copy
    w = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype) * 0.02   # noqa: E731
    return [{"qkv": w(q + 2 * kv, args.hidden), "o": w(args.hidden, q), "gate_up": w(2 * f, args.hidden),
             "down": w(args.hidden, f)} for _ in range(args.layers)]


def tp_forward(x: torch.Tensor, layers: list[dict], args: argparse.Namespace, world: int, comm: bool) -> torch.Tensor:
    """Megatron TP forward (Shoeybi et al. 2019 Fig. 3): all-reduce after attention and after the MLP."""
    import torch.nn.functional as F
    b, s, d = x.shape
    hd = d // args.heads
    nq, nkv = args.heads // world, max(args.kv_heads // world, 1)
    for L in layers:
        h = F.rms_norm(x, (d,))
        qkv = h @ L["qkv"].T                                                  # (b, s, (nq + 2 nkv) hd)
        qh, kh, vh = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        qh, kh, vh = (t.view(b, s, -1, hd).transpose(1, 2) for t in (qh, kh, vh))   # (b, heads, s, hd)
        a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        o = a.transpose(1, 2).reshape(b, s, nq * hd) @ L["o"].T               # (b, s, d), partial sum
        if comm:
            dist.all_reduce(o)
        x = x + o
        g, u = (F.rms_norm(x, (d,)) @ L["gate_up"].T).chunk(2, dim=-1)
        m = (F.silu(g) * u) @ L["down"].T                                     # (b, s, d), partial sum
        if comm:
            dist.all_reduce(m)
        x = x + m
    return x


def run_tp_forward(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layers = tp_layers(args, world, device, dtype)
    x = torch.randn(args.micro_batch, args.seq, args.hidden, device=device, dtype=dtype)
    out = {}
    with torch.no_grad():
        for label, comm in (("with_comm", True), ("compute_only", False)):
            t, times = measure(lambda: tp_forward(x, layers, args, world, comm), args, device, 1)
            out[label] = {"step_s": t, "times_s_rank0": times}
            if rank == 0:
                print(f"tp-forward {label:12s} {t * 1e3:9.3f} ms", flush=True)
    msg = args.micro_batch * args.seq * args.hidden * torch.tensor([], dtype=dtype).element_size()
    qwen7b = (args.hidden, args.ffn, args.heads, args.kv_heads) == (3584, 18944, 28, 4)
    model = "--model qwen2.5-7b" if qwen7b else "--model-config <toml with these shapes>"
    return {"schema": "scalelab.tp_forward_bench/1", "mode": "tp_forward", "backend": args.backend,
            "world_size": world, "dtype": str(dtype).replace("torch.", ""),
            "shape": {k: getattr(args, k) for k in ("hidden", "ffn", "heads", "kv_heads", "layers", "micro_batch", "seq")},
            "allreduces": 2 * args.layers, "allreduce_bytes": msg, **out,
            "comm_s_estimate": out["with_comm"]["step_s"] - out["compute_only"]["step_s"],
            "predict_with": f"scalelab calc train {model} --layers {args.layers} "
                            f"--no-head --forward-only --tp {world} --gpus {world} --micro-batch {args.micro_batch} "
                            f"--seq {args.seq} --global-batch {args.micro_batch} --gpu h200 --json"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init(args.backend)
    run = run_tp_forward if args.tp_forward else run_collectives
    doc = run(args, rank, world, device)
    if rank == 0:
        doc["provenance"] = provenance(world, device)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, out)
        print(f"wrote {out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
