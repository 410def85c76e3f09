"""Where a GPT-2 124M training micro-step spends its GPU time, by kernel family (torch.profiler), for the plain
recipe and any variant given as config overrides. Prints a table and writes JSON:

    python3 bench/gpu_pretrain_profile.py --out $OUT/profile.json [--set train.fp8=\\"all\\" ...]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalelab.pretrain import train_gpt  # noqa: E402
from scalelab.pretrain.config import load_pretrain_config  # noqa: E402

# first match wins; names are CUDA kernel names as the profiler reports them
FAMILIES = [("attention", r"flash|fmha|cudnn|attn|sdpa"), ("gemm", r"gemm|sm90_xmma|cutlass|nvjet|matmul|_scaled_mm"),
            ("optimizer", r"adam|foreach|multi_tensor"), ("cross_entropy", r"log_softmax|nll|cross_entropy"),
            ("communication", r"nccl"), ("copy", r"memcpy|memset|copy"), ("fused_elementwise", r"triton|elementwise|reduce")]


def family(name: str) -> str:
    return next((f for f, pattern in FAMILIES if re.search(pattern, name, re.I)), "other")


def profile(overrides: list[str], steps: int = 3) -> dict[str, float]:
    cfg = load_pretrain_config("configs/pretrain/gpt2-124m-fineweb-edu.toml", overrides)
    device, B, T = torch.device("cuda"), cfg.train.micro_batch_size, cfg.model.block_size
    model = train_gpt.GPT(cfg.model).to(device)
    if cfg.train.fp8 != "none":
        train_gpt.use_fp8(model, cfg.train.fp8)
    model = torch.compile(model)
    opt = train_gpt.make_optimizer(model, cfg, device)
    x = torch.randint(0, cfg.model.vocab_size, (B, T), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, x)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # compile and warm up outside the trace
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
        if us and ev.key and not ev.key.startswith("ProfilerStep"):
            totals[family(ev.key)] = totals.get(family(ev.key), 0.0) + us / 1000 / steps
    return totals


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    plain = profile([])
    variant = profile(args.set) if args.set else {}
    print(f"{'family':20s} {'plain ms':>9s} {'variant ms':>11s}   (per micro-step of 64 x 1024 tokens)")
    for f in sorted(set(plain) | set(variant), key=lambda k: -plain.get(k, 0.0)):
        print(f"{f:20s} {plain.get(f, 0.0):9.2f} {variant.get(f, 0.0):11.2f}")
    Path(args.out).write_text(json.dumps({"plain_ms": plain, "variant_ms": variant, "variant_sets": args.set}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
