"""Run a file of kernel cases under Triton's CPU interpreter: in a pytest subprocess, because TRITON_INTERPRET must
be set before triton is first imported (it wraps its own library functions at import)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_interpreted(cases: str) -> str:
    """pytest's stdout for the cases file (a path from the repository root), after asserting they all passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cases], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout
