"""The block GEMMs of a GPT-2 124M step one by one: bf16 against FP8 with per-tensor and per-row scales.

Shapes are those of one micro-batch (M = B*T tokens, default 128*1024) through the four Linears of a block
(d=768: qkv 768->2304, proj 768->768, fc 768->3072, fc-proj 3072->768), for each of the step's three GEMMs:
  fwd    y  = x @ w.T      (M, K) x (K, N)
  dgrad  gx = g @ w        (M, N) x (N, K)
  wgrad  gw = g.T @ x      (N, M) x (M, K)   (contraction over tokens)
Each is timed with CUDA events (median of --repeats after warm-up) as a bare GEMM on operands already in the
layout it wants, then the quantize pass it needs in train.fp8 (the scale's amax and the cast, eager, no fusion).
So the table separates what FP8 saves in the GEMM from what its scaling costs outside it. CUDA only.

    PYTHONPATH=src python3 bench/gpu_fp8_gemm.py --out /tmp/out/fp8_gemm.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from scalelab.core.provenance import collect
from scalelab.pretrain.fp8 import E4M3, E5M2, quantize, quantize_rows

LINEARS = {"qkv": (768, 2304), "proj": (768, 768), "fc": (768, 3072), "fc_proj": (3072, 768)}  # (in K, out N)


def time_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gemm_row(m: int, k: int, n: int, a_dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """(M, K) @ (K, N): bf16, FP8 per-tensor (cuBLAS), FP8 per-row (CUTLASS); and the quantize passes of A."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # column-major, as _scaled_mm wants it
    (a8, sa), (b8, sb) = quantize(a, a_dtype), quantize(b, E4M3)
    (ar8, sar), (br8, sbr) = quantize_rows(a, a_dtype), quantize_rows(b.t(), E4M3)
    br8 = br8.t()
    tflop = 2 * m * k * n / 1e12
    row = {
        "bf16_ms": time_ms(lambda: a @ b, repeats),
        "fp8_tensor_ms": time_ms(lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb,
                                                          out_dtype=torch.bfloat16), repeats),
        "fp8_row_ms": time_ms(lambda: torch._scaled_mm(ar8, br8, scale_a=sar, scale_b=sbr.t(),
                                                       out_dtype=torch.bfloat16), repeats),
        "quantize_tensor_ms": time_ms(lambda: quantize(a, a_dtype), repeats),
        "quantize_rows_ms": time_ms(lambda: quantize_rows(a, a_dtype), repeats),
        "transpose_fp8_ms": time_ms(lambda: a8.t().contiguous(), repeats),
    }
    for key in ("bf16", "fp8_tensor", "fp8_row"):
        row[f"{key}_tflops"] = tflop / (row[f"{key}_ms"] / 1e3)
    return row


def kernel_bench_args(doc: str, argv: list[str] | None) -> argparse.Namespace | None:
    """--tokens (per micro-batch), --repeats, --out of a kernel benchmark; None (after saying why) without CUDA."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128 * 1024, help="M: tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{Path(sys.argv[0]).name}: needs a CUDA GPU", file=sys.stderr)
        return None
    return args


def main(argv: list[str] | None = None) -> int:
    args = kernel_bench_args(__doc__, argv)
    if args is None:
        return 2
    rows = {}
    for name, (k, n) in LINEARS.items():
        m = args.tokens
        rows[f"{name} fwd"] = gemm_row(m, k, n, E4M3, args.repeats)
        rows[f"{name} dgrad"] = gemm_row(m, n, k, E5M2, args.repeats)
        rows[f"{name} wgrad"] = gemm_row(n, m, k, E5M2, args.repeats)  # g.T (N, M) @ x (M, K)
    print(f"{'GEMM':14s} {'bf16 ms':>8s} {'fp8 T ms':>8s} {'fp8 R ms':>8s} {'bf16 TF':>8s} {'T TF':>6s} {'R TF':>6s}"
          f" {'qT ms':>6s} {'qR ms':>6s} {'tr ms':>6s}")
    for name, r in rows.items():
        print(f"{name:14s} {r['bf16_ms']:8.3f} {r['fp8_tensor_ms']:8.3f} {r['fp8_row_ms']:8.3f} "
              f"{r['bf16_tflops']:8.0f} {r['fp8_tensor_tflops']:6.0f} {r['fp8_row_tflops']:6.0f} "
              f"{r['quantize_tensor_ms']:6.3f} {r['quantize_rows_ms']:6.3f} {r['transpose_fp8_ms']:6.3f}")
    sums = {key: sum(r[key] for r in rows.values()) for key in ("bf16_ms", "fp8_tensor_ms", "fp8_row_ms")}
    print("per block, all 12 GEMMs: " + ", ".join(f"{k} {v:.2f}" for k, v in sums.items()))
    meta = collect({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda})
    args.out.write_text(json.dumps({"tokens": args.tokens, "gemms": rows, "per_block_ms": sums,
                                    "provenance": meta, "git_sha": meta["git_sha"], "command": meta["command"]},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
