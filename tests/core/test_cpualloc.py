"""core/cpualloc.py: glibc accepts the three thresholds (each within mallopt's int and glibc's own bounds); a GPU
process and SCALELAB_CPU_MALLOPT=0 leave the defaults. Each case in a fresh process, so the setting stays there. The
speed it buys is measured by bench/cpu_alloc_ab.py, not here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.core import cpualloc

SRC = Path(__file__).resolve().parents[2] / "src"
CALL = (f"import sys; sys.path.insert(0, {str(SRC)!r}); "
        "from scalelab.core.cpualloc import keep_freed_memory as k; print(k(*sys.argv[1:]))")


def call(*device: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", CALL, *device], capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_accepts_the_thresholds_and_the_switch_leaves_them():
    assert call() == "True" and call("cpu") == "True"
    assert call("cuda") == "False"
    assert call(SCALELAB_CPU_MALLOPT="0") == "False"


def test_thresholds_fit_mallopt():
    assert 0 < cpualloc.MMAP_THRESHOLD <= 4 * 1024 * 1024 * 8   # glibc's ceiling on 64-bit
    assert cpualloc.TRIM_THRESHOLD < 2 ** 31 and cpualloc.TOP_PAD < 2 ** 31   # mallopt's value is a C int
