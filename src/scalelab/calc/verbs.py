"""The `scalelab calc train` and `scalelab calc disagg` verbs as functions: flags -> setup -> estimate -> the text
printed. commands.py registers them on the CLI; docs.py and the bench scripts run them in-process through parser().

    scalelab calc train --model llama-3-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 4 --sp \\
        --micro-batch 1 --seq 8192 --global-batch 256
    scalelab calc train --model-config configs/pretrain/gpt2-124m-fineweb-edu.toml --gpu h200 --gpus 2 --dp-mode fsdp
    scalelab calc disagg --model llama-3.1-70b --gpu h100-sxm --workload long-prompt
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from scalelab.calc.cluster import make_cluster
from scalelab.calc.disagg import DisaggResult, analyze, auto_tp
from scalelab.calc.layout import DP_MODES, RECOMPUTE, Batch, Layout, TrainSetup
from scalelab.calc.modelconfig import BatchDefaults, load_model_file
from scalelab.calc.models import ModelSpec, count_params
from scalelab.calc.parallelism import setup_params
from scalelab.calc.plan import StepEstimate, compute_times, estimate_step
from scalelab.calc.precision import PRECISIONS, get_precision
from scalelab.calc.presets import PRESETS, get_model
from scalelab.calc.report import Table, disagg_sentences, disagg_tables, render, train_sentences, train_tables
from scalelab.calc.servemodel import MeasuredRates, ServeSetup, load_measured
from scalelab.calc.workload import DISTRIBUTIONS, WORKLOADS, LengthDist, Workload, get_workload
from scalelab.core.jsonio import json_safe
from scalelab.core.hardware import HARDWARE


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The train and disagg verbs, each with its flags. Of the parsed args, func prints, text returns what it
    prints and written returns the tables and sentences before rendering."""
    train = verbs.add_parser("train", help="per-step communication, memory, compute and MFU of a parallel layout",
                             description="Per-step and per-token communication of DP/FSDP, TP/SP, PP, CP and EP, "
                                         "memory per GPU, compute time, and the MFU bound.")
    _model_args(train, "gpt2-124m")
    _cluster_args(train)
    _train_args(train)
    _output_args(train)
    train.set_defaults(func=run_train, text=train_text, written=train_written)
    disagg = verbs.add_parser("disagg", help="colocated vs disaggregated prefill/decode: goodput, KV transfer, crossover",
                              description="Goodput per GPU of colocated and disaggregated (P:D) serving under TTFT/"
                                          "TPOT SLOs, the KV-cache transfer cost, and where disaggregation pays.")
    _model_args(disagg, "llama-3.1-70b")
    _cluster_args(disagg)
    _disagg_args(disagg)
    _output_args(disagg)
    disagg.set_defaults(func=run_disagg, text=disagg_text, written=disagg_written)


def parser() -> argparse.ArgumentParser:
    """`scalelab calc` with the train and disagg verbs alone, for running them in-process."""
    p = argparse.ArgumentParser(prog="scalelab calc")
    add_verbs(p.add_subparsers(dest="verb", metavar="<verb>", required=True))
    return p


def output(argv: list[str]) -> str:
    """What `scalelab calc <argv>` prints, e.g. output(["train", "--model", "gpt2-124m", "--format", "md"])."""
    args = parser().parse_args(argv)
    return args.text(args)


def _model_args(p: argparse.ArgumentParser, default: str) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=default, help=f"preset: {', '.join(PRESETS)} (default {default})")
    g.add_argument("--model-config", metavar="TOML", help="model from a TOML file ([model] with layers, hidden, "
                   "heads, kv_heads, ffn, vocab, experts, top_k, ...; or a scalelab pretrain config)")
    g.add_argument("--layers", type=int, help="override the depth (e.g. a layer stack for a benchmark)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", default="h100-sxm", choices=list(HARDWARE), help="hardware table key (default h100-sxm)")
    g.add_argument("--gpus-per-node", type=int, help="default: per hardware (8 for DGX-class GPUs)")
    g.add_argument("--intra-bw", type=float, metavar="GB/s", help="NVLink bus bandwidth per GPU, overrides table/fit")
    g.add_argument("--inter-bw", type=float, metavar="GB/s", help="NIC bandwidth per GPU per direction")
    g.add_argument("--latency", type=float, metavar="us", help="intra-node collective latency")
    g.add_argument("--inter-latency", type=float, metavar="us", help="inter-node collective latency")
    g.add_argument("--no-calibration", action="store_true", help="ignore <results>/<gpu>/nccl_*.json fits")
    g.add_argument("--results", type=Path, metavar="DIR", help="the <results> folder those fits are read from "
                   "(default $SCALELAB_RESULTS_DIR, else the repository's results folder)")


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--format", choices=("text", "md"), default="text", help="table style (default text)")


# ---------------------------------------------------------------------------------------------
# train


def _train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout and batch")
    g.add_argument("--gpus", type=int, help="total GPUs (default tp*pp*cp*dp)")
    for name, text in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        g.add_argument(f"--{name}", type=int, default=1, help=f"{text}-parallel degree (default 1)")
    g.add_argument("--dp", type=int, help="data-parallel degree (default gpus/(tp*pp*cp))")
    g.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (>1: interleaved 1F1B)")
    g.add_argument("--sp", action="store_true", help="sequence parallelism with TP")
    g.add_argument("--dp-mode", choices=DP_MODES, help="ddp | zero1 | zero2 | fsdp (default ddp)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="selective",
                   help="activation recompute (default selective = attention core not stored, as FlashAttention)")
    g.add_argument("--ep-overlap", action="store_true", help="hide EP all-to-all behind compute (DualPipe)")
    g.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default 1, or the pretrain config's)")
    g.add_argument("--seq", type=int, help="sequence length (default 2048, or the pretrain config's block_size)")
    g.add_argument("--global-batch", type=int, help="sequences per optimizer step (default micro-batch*dp)")
    g.add_argument("--precision", choices=list(PRECISIONS),
                   help="default bf16-mixed (amp-bf16 for a scalelab pretrain config: fp32 weights + autocast)")
    g.add_argument("--compute-eff", type=float, default=0.5,
                   help="share of bf16 peak the matmuls reach (default 0.5); or set --measured-compute-s")
    g.add_argument("--measured-compute-s", type=float, metavar="S",
                   help="measured time of one step's compute on one GPU with no communication (a 1-GPU run of the "
                        "same per-GPU batch, or nccl_bench --tp-forward's compute_only): sets --compute-eff")
    g.add_argument("--forward-only", action="store_true", help="one forward pass (no backward, no DP traffic)")
    g.add_argument("--no-head", action="store_true", help="bare layer stack: no embedding or output head")
    g.add_argument("--dropout", action="store_true", help="dropout masks stored (Korthikanti's 34 sbh)")


def _model(args: argparse.Namespace) -> tuple[ModelSpec, BatchDefaults]:
    model, defaults = load_model_file(args.model_config) if args.model_config else (get_model(args.model), BatchDefaults())
    return (model.with_layers(args.layers) if args.layers else model), defaults


def build_train_setup(args: argparse.Namespace) -> TrainSetup:
    model, d = _model(args)
    inner = args.tp * args.pp * args.cp
    gpus = args.gpus or inner * (args.dp or 1)
    dp = args.dp or max(gpus // inner, 1)
    micro = args.micro_batch or d.micro_batch or 1
    seq = args.seq or d.seq or 2048
    global_batch = args.global_batch or (d.global_batch_tokens // seq if d.global_batch_tokens else micro * dp)
    layout = Layout(args.tp, args.pp, dp, args.cp, args.ep, args.vpp, args.sp, args.dp_mode or d.dp_mode or "ddp",
                    args.recompute, args.ep_overlap)
    cluster = make_cluster(args.gpu, gpus, intra_bw_gb_s=args.intra_bw, inter_bw_gb_s=args.inter_bw,
                           latency_us=args.latency, inter_latency_us=args.inter_latency,
                           gpus_per_node=args.gpus_per_node, calibrate=not args.no_calibration,
                           calibration_root=args.results)
    precision = get_precision(args.precision or d.precision or "bf16-mixed")
    return TrainSetup(model, layout, Batch(micro, seq, global_batch), cluster, precision,
                      forward_only=args.forward_only, with_head=not args.no_head, dropout=args.dropout)


def train_summary(e: StepEstimate) -> dict[str, Any]:
    """The numbers a measured run is compared with."""
    return {"model": e.setup.model.name, "params": setup_params(e.setup), "gpus": e.setup.layout.world,
            "compute_eff": e.compute_eff, "model_flops_per_token": e.compute.model_flops_per_token,
            "tokens_per_step": e.tokens_per_step, "step_s": e.step_s, "compute_s": e.compute.total_s,
            "comm_s": e.comm_s, "exposed_comm_s": e.exposed_comm_s, "bubble_s": e.bubble_s,
            "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "mfu_bound": e.mfu_bound,
            "memory_per_gpu_bytes": e.memory.total_bytes,
            "per_dim": {d: {"time_s": t, "exposed_s": x, "bytes_per_gpu_step": b, "bytes_per_token": bt}
                        for d, (t, x, b, bt) in e.dim_totals().items()},
            "dominant": e.dominant}


def compute_eff_from(setup: TrainSetup, measured_compute_s: float) -> float:
    """The efficiency at which this GPU's compute alone takes the measured compute-only time."""
    return compute_times(setup, 1.0).total_s / measured_compute_s


def train_estimate(args: argparse.Namespace) -> StepEstimate:
    setup = build_train_setup(args)
    eff = compute_eff_from(setup, args.measured_compute_s) if args.measured_compute_s else args.compute_eff
    return estimate_step(setup, eff)


def train_written(args: argparse.Namespace) -> tuple[list[Table], list[str]]:
    est = train_estimate(args)
    return train_tables(est), train_sentences(est)


def train_text(args: argparse.Namespace) -> str:
    if args.json:
        est = train_estimate(args)
        return _dumps({"summary": train_summary(est), "estimate": dataclasses.asdict(est)}) + "\n"
    return render(*train_written(args), args.format)


def run_train(args: argparse.Namespace) -> int:
    print(train_text(args), end="")
    return 0


def _dumps(obj: Any) -> str:
    return json.dumps(json_safe(obj), indent=2)


# ---------------------------------------------------------------------------------------------
# disagg


def _disagg_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving")
    g.add_argument("--tp", type=int, help="GPUs per instance (default: smallest power of 2 with weights <= 50%% of memory)")
    g.add_argument("--workload", default="sharegpt", choices=list(WORKLOADS), help="length distributions and SLOs")
    g.add_argument("--prompt-dist", metavar="KIND:MEAN[:SIGMA[:LO:HI]]",
                   help=f"override prompt lengths; kinds: {', '.join(DISTRIBUTIONS)} (e.g. lognormal:250:1.0:4:4096)")
    g.add_argument("--output-dist", metavar="KIND:MEAN[:SIGMA[:LO:HI]]", help="override output lengths")
    g.add_argument("--rate", type=float, help="arrival rate, requests/s (GPUs needed at this rate)")
    g.add_argument("--ttft-slo", type=float, metavar="S", help="p90 time-to-first-token SLO, seconds")
    g.add_argument("--tpot-slo", type=float, metavar="S", help="mean time-per-output-token SLO, seconds")
    g.add_argument("--prefill-eff", type=float, default=0.6, help="share of bf16 peak in prefill (default 0.6)")
    g.add_argument("--hbm-eff", type=float, default=0.8, help="share of HBM bandwidth in decode (default 0.8)")
    g.add_argument("--mem-util", type=float, default=0.9, help="share of GPU memory for weights+KV (default 0.9)")
    g.add_argument("--kv-link", choices=("intra", "inter"), default="inter",
                   help="where prefill and decode instances sit: same node (NVLink) or not (NIC; default)")
    g.add_argument("--measured", metavar="JSON", help='measured rates: {"prefill_tokens_per_s": x, '
                   '"decode_step_s": {"batch": seconds, ...}} (from the serve job)')
    g.add_argument("--no-scan", action="store_true", help="skip the crossover scans (faster)")


def parse_dist(text: str) -> LengthDist:
    parts = text.split(":")
    if len(parts) not in (2, 3, 5):
        raise ValueError(f"length distribution {text!r}: expected KIND:MEAN[:SIGMA[:LO:HI]]")
    if parts[0] not in DISTRIBUTIONS:
        raise ValueError(f"length distribution {text!r}: kind must be one of {', '.join(DISTRIBUTIONS)}")
    nums = [float(x) for x in parts[1:]]
    lo_hi = dict(lo=nums[2], hi=nums[3]) if len(nums) == 4 else {}
    return LengthDist(parts[0], nums[0], nums[1] if len(nums) > 1 else 0.0, **lo_hi)


def build_serve_setup(args: argparse.Namespace) -> tuple[ServeSetup, Workload]:
    model, _ = _model(args)
    w = get_workload(args.workload)
    changes = {k: v for k, v in (("prompt", args.prompt_dist and parse_dist(args.prompt_dist)),
                                 ("output", args.output_dist and parse_dist(args.output_dist)),
                                 ("rate_rps", args.rate), ("ttft_slo_s", args.ttft_slo),
                                 ("tpot_slo_s", args.tpot_slo)) if v}
    w = dataclasses.replace(w, **changes)
    hw_mem = HARDWARE[args.gpu].memory_bytes
    tp = args.tp or auto_tp(count_params(model).total * 2.0, hw_mem)
    cluster = make_cluster(args.gpu, max(tp, args.gpus_per_node or 8), intra_bw_gb_s=args.intra_bw,
                           inter_bw_gb_s=args.inter_bw, latency_us=args.latency, inter_latency_us=args.inter_latency,
                           gpus_per_node=args.gpus_per_node, calibrate=not args.no_calibration,
                           calibration_root=args.results)
    measured = load_measured(args.measured) if args.measured else MeasuredRates()
    return ServeSetup(model, cluster, tp, args.prefill_eff, args.hbm_eff, args.mem_util, measured=measured), w


def disagg_result(args: argparse.Namespace) -> DisaggResult:
    ss, w = build_serve_setup(args)
    return analyze(ss, w, args.kv_link, scans=not args.no_scan)


def disagg_written(args: argparse.Namespace) -> tuple[list[Table], list[str]]:
    result = disagg_result(args)
    return disagg_tables(result), disagg_sentences(result)


def disagg_text(args: argparse.Namespace) -> str:
    if args.json:
        result = disagg_result(args)
        return _dumps({"sentences": disagg_sentences(result), "result": dataclasses.asdict(result)}) + "\n"
    return render(*disagg_written(args), args.format)


def run_disagg(args: argparse.Namespace) -> int:
    print(disagg_text(args), end="")
    return 0
