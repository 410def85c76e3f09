#!/usr/bin/env python
"""Every module an import chain needs that this interpreter lacks, found in one run.

    python bench/import_probe.py sglang.srt.entrypoints.http_server sgl_kernel --out missing.json

A plain import stops at the first ModuleNotFoundError, so on a machine reached one call at a time a bundle would
need one call per missing package. Here a meta-path finder placed last answers every module no other finder
can load with an empty stand-in module (whose attributes are stand-ins too), records its name, and the import
goes on. The stand-ins make later failures likely (a stand-in class cannot be subclassed as the real one, a
version check reads nonsense), so the result is a list to act on, not proof of a working import: after adding
what it names, the real import is run again without the probe.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import traceback
import types
from pathlib import Path


class _Anything(types.ModuleType):
    """A module whose every attribute is another stand-in, so `from x import y` and `x.y.z` both succeed."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = _Anything(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args, **kwargs):
        return _Anything(f"{self.__name__}()")


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: reached only for modules no real finder has."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top not in {m.split(".")[0] for m in self.missing}:
            self.missing.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _Anything(spec.name)
        module.__path__ = []  # a package, so its submodules are looked up (and stood in for) too
        return module

    def exec_module(self, module) -> None:
        return None


def probe(targets: list[str]) -> dict:
    """Import each target with the stand-in finder installed; the missing top-level modules (first name that
    asked for each), and each target's error if it still failed."""
    finder = StandInFinder()
    sys.meta_path.append(finder)
    errors = {}
    try:
        for name in targets:
            try:
                importlib.import_module(name)
            except Exception as e:  # the stand-ins can break later code: record it and go on to the next target
                errors[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
    finally:
        sys.meta_path.remove(finder)
    return {"targets": targets, "missing": finder.missing, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+", help="modules to import, in order")
    ap.add_argument("--out", help="JSON file for the result (also printed)")
    a = ap.parse_args()
    result = probe(a.targets)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
