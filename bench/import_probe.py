#!/usr/bin/env python
"""Every module an import chain needs that this interpreter lacks, and the first error that is not a missing
module, found in one call.

    python bench/import_probe.py sglang.srt.entrypoints.http_server sgl_kernel --out missing.json

A plain import stops at the first ModuleNotFoundError, so on a machine reached one call at a time a bundle would
need one call per missing package. Here the import runs in rounds, each in a fresh interpreter: a round that
fails on a missing module adds that module's top-level package to the stand-ins of the next round, until the
targets import or a round fails otherwise (a version check, a C extension that will not load: the things a
stand-in cannot paper over, reported as `error`). Only modules whose absence raised are stood in for, so an
optional import guarded by `try/except ImportError` is not reported. A stand-in module answers every attribute
with a class under a permissive metaclass, so it can be subclassed, subscripted (`X[int]`), called, and used as
a decorator. The result is a list to act on, not proof of a working import: after adding what it names, the
real import is run again without the probe.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MAX_ROUNDS = 60
TAIL_LINES = 15

# Runs inside each round's interpreter: argv = [stand-in top-level names as JSON, target, ...]; prints one JSON
# line: {"ok": true} or {"missing": name} or {"error": traceback tail}.
ROUND = r'''
import importlib, importlib.abc, importlib.machinery, json, sys, traceback, types
STAND_INS = set(json.loads(sys.argv[1]))

class Permissive(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Permissive(name, (object,), {})
    def __getitem__(cls, key):
        return cls
    def __or__(cls, other):
        return cls
    __ror__ = __or__
    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: the function stays itself
        return type.__call__(cls)

class StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Permissive(name, (object,), {})

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        module = StandIn(spec.name)
        module.__path__ = []
        return module
    def exec_module(self, module):
        return None

sys.meta_path.insert(0, Finder())
try:
    for target in sys.argv[2:]:
        importlib.import_module(target)
except ModuleNotFoundError as e:
    print(json.dumps({"missing": e.name or str(e), "error": traceback.format_exc()}))
except BaseException:
    print(json.dumps({"error": traceback.format_exc()}))
else:
    print(json.dumps({"ok": True}))
'''


def run_round(targets: list[str], stand_ins: list[str], python: str) -> dict:
    out = subprocess.run([python, "-c", ROUND, json.dumps(stand_ins), *targets], capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:  # the interpreter died before reporting (a crash in a C extension)
        return {"error": f"exit {out.returncode}: " + "\n".join(out.stderr.splitlines()[-TAIL_LINES:])}
    return json.loads(lines[-1])


def probe(targets: list[str], python: str = sys.executable, max_rounds: int = MAX_ROUNDS) -> dict:
    """{"targets", "missing": top-level names in the order the chain asked for them, "error": the first other
    failure's traceback tail (None when the targets imported), "rounds"}."""
    missing: list[str] = []
    error = "round limit reached"
    for rounds in range(1, max_rounds + 1):
        r = run_round(targets, missing, python)
        if r.get("ok"):
            error = None
            break
        top = (r.get("missing") or "").split(".")[0]
        if top and top not in missing:
            missing.append(top)
            continue
        error = "\n".join(r["error"].splitlines()[-TAIL_LINES:])
        break
    return {"targets": targets, "missing": missing, "error": error, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+", help="modules to import, in order")
    ap.add_argument("--out", help="JSON file for the result (also printed)")
    a = ap.parse_args()
    # provenance: the command, and the commit when the caller names it (the bundle's copy runs outside a checkout)
    result = {**probe(a.targets), "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "git_sha": os.environ.get("SCALELAB_GIT_SHA", "unknown")}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
