"""A bench/ script loaded as a module for its tests (bench/ is not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py, executed once as module `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # dataclasses resolve the module's annotations through sys.modules
    sys.path.insert(0, str(BENCH))  # a script may import its siblings, as it does when run from bench/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module
