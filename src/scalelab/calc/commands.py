"""`scalelab calc <verb>`: train and disagg (verbs.py: flags, setup, compute, print) and docs (docs.py: the
write-up docs/calc.md from its manifest).

    scalelab calc train --model llama-3-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 4 --sp \\
        --micro-batch 1 --seq 8192 --global-batch 256
    scalelab calc disagg --model llama-3.1-70b --gpu h100-sxm --workload long-prompt
    scalelab calc docs docs/calc.toml
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Callable

from scalelab.calc.verbs import add_verbs
from scalelab.core.config import ConfigError


def register(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    add_verbs(verbs)
    for name in ("train", "disagg"):
        p = verbs.choices[name]
        p.set_defaults(func=_guard(p.get_default("func")))
    docs = verbs.add_parser("docs", help="write docs/calc.md from its manifest: prose, calc's own output and the "
                                         "committed calibration results")
    docs.add_argument("manifest", nargs="?", default="docs/calc.toml", help="docs manifest (default docs/calc.toml)")
    docs.add_argument("--out", help="Markdown file (default: the manifest's `out`)")
    docs.set_defaults(func=_guard(_docs))


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Bad input (unknown preset, impossible layout, missing file) is a one-line error and exit code 2."""
    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ConfigError:
            raise
        except (KeyError, ValueError, OSError) as e:
            print(f"scalelab calc: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
            return 2
    return run


def _docs(args: argparse.Namespace) -> int:
    # imported when the verb runs, as the other jobs' docs verbs: the CLI builds every parser at start
    from scalelab.calc.docs import docs
    print(f"wrote {docs(args.manifest, Path(args.out) if args.out else None)}")
    return 0
