"""`scalelab <job> <verb>`: a thin dispatcher. Each job module registers its own verbs."""
from __future__ import annotations

import argparse
import importlib
import sys

from scalelab.core.errors import ScalelabError

# job name -> module exposing `register(subparsers)`; each verb sets `func(args) -> int`.
JOBS = {
    "pretrain": ("scalelab.pretrain.commands", "GPT-2 pretraining: prepare, train, predict, parity, export, eval, heldout, report"),
    "calc": ("scalelab.calc.commands", "back-of-envelope engines: parallelism communication, disaggregation"),
    "demo": ("scalelab.demo", "run the whole offline CPU demo end to end"),
    "dpo": ("scalelab.dpo.commands", "preference tuning: LoRA DPO / IPO / ORPO with TRL, margins, sweep, merge"),
    "serve": ("scalelab.serve.commands", "serving sweep: vLLM/SGLang per TP x batch -> the scaling table, report"),
    "grpo": ("scalelab.grpo.commands", "GRPO with measured rollout / reward / update / weight-sync phases"),
    "evals": ("scalelab.evals.commands", "evaluation: the baseline battery of a model (vLLM generative tasks, lm-eval "
                                         "multiple choice) -> battery.json, REPORT.md"),
    "models": ("scalelab.core.models_cli", "model registry: list, fetch, verify, path (cache: $SCALELAB_CACHE)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalelab", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a data, model, server or config error instead of one line")
    jobs = parser.add_subparsers(dest="job", metavar="<job>", required=True)
    for name, (module, help_text) in JOBS.items():
        job_parser = jobs.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).register(job_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The project's own errors (bad input a user can fix) end in one line on stderr and exit status 2;
    anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ScalelabError as e:
        if args.debug:
            raise
        print(f"scalelab: {e.kind}: {one_line(e)}", file=sys.stderr)
        return 2


def one_line(error: BaseException) -> str:
    # a message wrapping a subprocess's output may span lines; the contract is one line
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
