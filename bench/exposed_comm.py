#!/usr/bin/env python
"""Exposed communication of the pretrain trainer's data-parallel step, predicted by calc first, then measured.

    torchrun --nproc-per-node 2 bench/exposed_comm.py --config configs/pretrain/gpt2-124m-fineweb-edu.toml \\
        --set train.parallel=\\"ddp\\" --out /tmp/out/exposed-ddp
    torchrun --nproc-per-node 2 bench/exposed_comm.py --config configs/pretrain/tiny-cpu.toml --out /tmp/x  # gloo

Builds the model exactly as train_gpt.train does (train_gpt.build), steps on one fixed batch of random tokens
(timing only: the data does not change the kernels), and measures the same optimizer step with and without its
gradient collectives in interleaved repeats (pretrain/exposed_comm.py says what each skips). On CUDA it then
profiles --profile-steps steps and reads exposed collective time off the kernel trace. Rank 0 writes
predictions.json (calc's communication before and after overlap for this setup) before the first timed step,
then results.json and provenance.json.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.calc.verbs import build_train_setup, parser
from scalelab.calc.plan import estimate_step
from scalelab.core.config import dump_toml
from scalelab.core.jsonio import write_json
from scalelab.core.provenance import collect
from scalelab.pretrain import train_gpt
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.exposed_comm import ab_exposed, trace_exposed

DEFAULT_COMPUTE_EFF = 0.42          # calc's compute share only sets overlap windows here; the term scored is comm


def calc_args(config: str, cfg, world: int, gpu: str) -> list[str]:
    fsdp = cfg.train.parallel == "fsdp2"
    return ["train", "--model-config", config, "--gpu", gpu, "--gpus", str(world), "--dp-mode",
            "fsdp" if fsdp else "ddp", "--precision", "fsdp2-bf16" if fsdp else "amp-bf16"]


def predict(config: str, cfg, world: int, gpu: str, compute_eff: float) -> dict:
    argv = calc_args(config, cfg, world, gpu)
    est = estimate_step(build_train_setup(parser().parse_args(argv)), compute_eff)
    return {"command": "scalelab calc " + " ".join(argv) + f" --compute-eff {compute_eff}",
            "comm_before_overlap_s": est.comm_s, "exposed_comm_s": est.exposed_comm_s,
            "compute_s": est.compute.total_s, "written_unix": time.time()}


@contextlib.contextmanager
def gradient_sync(enabled: bool):
    """With enabled=False every micro-step of train_gpt.train_step skips its gradient collective."""
    original = train_gpt.set_grad_sync
    if not enabled:
        train_gpt.set_grad_sync = lambda model, cfg, world, sync: original(model, cfg, world, False)
    try:
        yield
    finally:
        train_gpt.set_grad_sync = original


def timed_steps(n: int, parts, device: torch.device) -> float:
    """Seconds per optimizer step over n steps, all ranks started together."""
    model, optimizer, cfg, world, autocast, accum, batch = parts
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        train_gpt.train_step(model, optimizer, None, cfg, world, device, autocast, accum, batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    dist.barrier()
    return (time.perf_counter() - t0) / n


def ab_repeats(parts, device: torch.device, steps: int, repeats: int) -> tuple[list[float], list[float]]:
    """Alternating order per repeat, so a drift in clocks falls on both arms alike."""
    with_s, without_s = [], []
    for r in range(repeats):
        for enabled in ((True, False) if r % 2 == 0 else (False, True)):
            with gradient_sync(enabled):
                (with_s if enabled else without_s).append(timed_steps(steps, parts, device))
    return with_s, without_s


def grads_agree(parts, device: torch.device, enabled: bool) -> bool | None:
    """After one step's backward, do the ranks hold the same gradient? (DDP only: FSDP2 keeps shards.) Each
    rank steps on its own batch, so they agree only if the arm all-reduced: the check that the switch works."""
    model, optimizer, cfg, world, autocast, accum, batch = parts
    if cfg.train.parallel != "ddp":
        return None
    with gradient_sync(enabled):
        train_gpt.train_step(model, optimizer, None, cfg, world, device, autocast, accum, batch)
    local = torch.stack([p.grad.double().sum() for p in model.parameters() if p.grad is not None]).to(device)
    optimizer.zero_grad(set_to_none=True)
    every = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    return all(torch.allclose(every[0], other, rtol=1e-6, atol=1e-9) for other in every[1:])


def profiled(parts, device: torch.device, steps: int, rank: int, out: Path) -> dict | None:
    if device.type != "cuda" or steps <= 0:
        return None
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        timed_steps(steps, parts, device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    if rank == 0:
        with gzip.open(out / "trace_rank0.json.gz", "wt") as f:
            json.dump(trace, f)
    return asdict(trace_exposed(trace, steps)) | {"overlapped_share": trace_exposed(trace, steps).overlapped_share}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile, NCCL set-up)")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=4, help="repeats of each arm, interleaved")
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps on CUDA (0: none)")
    ap.add_argument("--gpu", default=None, help="calc hardware key (default: detected)")
    ap.add_argument("--compute-eff", type=float, default=DEFAULT_COMPUTE_EFF)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = load_pretrain_config(args.config, args.set)
    rank, world, device = train_gpt.setup_distributed(cfg)
    if world < 2:
        raise SystemExit("exposed communication needs >= 2 ranks: run under torchrun --nproc-per-node 2")
    out = Path(args.out)
    gpu = args.gpu or ("h200" if device.type == "cuda" else "cpu")
    if rank == 0:      # calc reads the resolved config, --set overrides included
        out.mkdir(parents=True, exist_ok=True)
        dump_toml(cfg, out / "config.toml")
        write_json(out / "predictions.json", predict(str(out / "config.toml"), cfg, world, gpu, args.compute_eff))
    torch.manual_seed(cfg.train.seed)
    model, optimizer, autocast, _, _ = train_gpt.build(cfg, world, device)
    g = torch.Generator().manual_seed(cfg.train.seed + rank)      # a batch per rank, as a data loader gives
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.train.micro_batch_size, cfg.model.block_size + 1), generator=g)
    batch = (tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device))
    parts = (model, optimizer, cfg, world, autocast, cfg.grad_accum(world), batch)
    timed_steps(args.warmup, parts, device)
    agree = {"sync": grads_agree(parts, device, True), "nosync": grads_agree(parts, device, False)}
    with_s, without_s = ab_repeats(parts, device, args.steps, args.repeats)
    trace = profiled(parts, device, args.profile_steps, rank, out)
    if rank == 0:
        write_json(out / "results.json", {"schema": "scalelab.exposed_comm/1", "world_size": world,
                                          "parallel": cfg.train.parallel, "sync_step_s": with_s,
                                          "nosync_step_s": without_s, "ab": asdict(ab_exposed(with_s, without_s)),
                                          "grads_agree_across_ranks": agree, "trace": trace})
        write_json(out / "provenance.json", collect({"config": args.config, "overrides": args.set}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
