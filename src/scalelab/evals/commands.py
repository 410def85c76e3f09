"""`scalelab evals <verb>`: battery."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def _engine_flag(text: str) -> tuple[str, str | bool]:
    """'max-num-seqs=64' -> ('max-num-seqs', '64'); 'enforce-eager' -> ('enforce-eager', True)."""
    key, sep, value = text.partition("=")
    if not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY or KEY=VALUE, got {text!r}")
    return key.strip().removeprefix("--"), value if sep else True


def _batch_size(text: str) -> int | str:
    if text == "auto" or text.startswith("auto:"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    p = verbs.add_parser("battery", help="the baseline battery of a model: generative tasks through a vLLM server "
                                         "(gsm8k, math500, humaneval, mbpp, ifeval_lite, tool calls), then the "
                                         "multiple-choice tasks through lm-eval; battery.json, REPORT.md; resumable")
    p.add_argument("--model", required=True, help="registry name, hub id or HF model folder")
    p.add_argument("--out", required=True, type=Path, help="output folder (a second run continues it)")
    p.add_argument("--tasks", default="all", help="comma-separated task names or groups: generate, mc, all")
    p.add_argument("--limit", type=int, default=None, help="the first N items of each task (smoke tests)")
    p.add_argument("--engine-python", default="", help="python with vllm (default $SCALELAB_VLLM_PYTHON, else "
                                                       "this one)")
    p.add_argument("--engine-flag", action="append", type=_engine_flag, default=[], metavar="KEY[=VALUE]",
                   help="extra vLLM server flag, repeatable (e.g. enforce-eager, max-num-seqs=64)")
    p.add_argument("--max-model-len", type=int, default=8192, help="the server's context length")
    p.add_argument("--server-url", default="", help="use a server already running at URL; none is launched")
    p.add_argument("--data-dir", type=Path, default=None, help="the shared data folder (default ../shared/data)")
    p.add_argument("--concurrency", type=int, default=128, help="chat requests in flight")
    p.add_argument("--lm-eval-batch-size", type=_batch_size, default=16, help="lm-eval batch size (or auto)")
    p.add_argument("--lm-eval-device", default="auto", help="auto (cuda when available), cuda, cpu")
    p.add_argument("--lm-eval-dtype", default="auto", help="auto (bfloat16 on GPU, float32 on CPU) or a dtype")
    p.add_argument("--allow-weak-sandbox", action="store_true",
                   help="run model-written code even where the sandbox has no OS isolation layer")
    p.add_argument("--reference-model", default="", help="registry name whose published figures are shown "
                                                          "(default: the model's own, from its folder)")
    p.set_defaults(func=_battery)


# The handler imports the battery when it runs: the CLI builds every parser at start, and the battery's modules
# load the task registry and lm-eval's harness.
def _battery(args: argparse.Namespace) -> int:
    from scalelab.evals.battery import BatteryConfig, run_battery
    from scalelab.evals.battery_plan import BatteryInputError, select_tasks
    if args.limit is not None and args.limit < 1:
        raise BatteryInputError(f"--limit {args.limit}: must be >= 1")
    if args.concurrency < 1:
        raise BatteryInputError(f"--concurrency {args.concurrency}: must be >= 1")
    cfg = BatteryConfig(
        model=args.model, out_dir=args.out, tasks=select_tasks(args.tasks), limit=args.limit,
        data_dir=args.data_dir, engine_python=args.engine_python, server_url=args.server_url,
        concurrency=args.concurrency, max_model_len=args.max_model_len, engine_flags=dict(args.engine_flag),
        allow_weak_sandbox=args.allow_weak_sandbox, lm_eval_batch_size=args.lm_eval_batch_size,
        lm_eval_device=args.lm_eval_device, lm_eval_dtype=args.lm_eval_dtype, reference_model=args.reference_model)
    # SIGTERM (a time limit's `timeout`) unwinds like an exception, so the vLLM server, in a session of its own,
    # is stopped rather than left holding the GPU for the run that continues this one
    before = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        path = run_battery(cfg, say=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        signal.signal(signal.SIGTERM, before)
    print(f"battery: {path}\nreport: {path.with_name('REPORT.md')}")
    return 0
