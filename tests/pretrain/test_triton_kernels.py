"""The Triton kernels on CPU: ce_kernel.py (train.loss_kernel='triton'*) and fp8_kernels.py (train.fp8_gelu_kernel).
Their cases (*_kernel_cases.py) run under Triton's interpreter in a pytest subprocess, since TRITON_INTERPRET must be
set before triton is first imported (it wraps its own library functions at import); here, too, the refusal to run on
CPU without the interpreter, their compilation for Hopper, and the GELU kernel's config rule."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from scalelab.core.config import ConfigError  # noqa: E402
from scalelab.pretrain import ce_kernel, fp8_kernels, kernel_builds  # noqa: E402
from scalelab.pretrain.config import load_pretrain_config  # noqa: E402
from tests.pretrain.test_train_gpt import TINY  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cases, n", [("tests/pretrain/ce_kernel_cases.py", 8),
                                      ("tests/pretrain/fp8_kernel_cases.py", 5)])
def test_kernel_cases_under_the_interpreter(cases, n):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cases], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{n} passed" in run.stdout  # every case ran: none skipped or deselected


@pytest.mark.parametrize("launch, message", [
    (lambda: ce_kernel.cross_entropy_rows_(torch.zeros(2, 8), torch.zeros(2, dtype=torch.long), 8, 0.5, True),
     "loss_kernel='triton' runs on CUDA"),
    (lambda: fp8_kernels.gelu_rows(torch.zeros(2, 8, dtype=torch.bfloat16)), "fp8_gelu_kernel runs on CUDA"),
])
def test_kernels_refuse_cpu_without_the_interpreter(monkeypatch, launch, message):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match=message):
        launch()


@pytest.mark.parametrize("name", kernel_builds.BUILDS)
def test_kernels_compile_for_hopper(name):
    """Triton compiles for sm_90 with its own ptxas, no GPU needed: what the CPU interpreter cannot check (types
    the compiler refuses, layouts it cannot lower) fails here, before any GPU time. Given the launch's
    specialization of 16-divisible pointers and strides, the row loads must come out as 16-byte vector loads, and
    the outputs must be rounded by the hardware's casts where the kernel uses them."""
    build = kernel_builds.BUILDS[name]
    compiled = kernel_builds.compile_sm90(build)
    ptx = compiled.asm["ptx"]
    assert compiled.asm["cubin"] and ".target sm_90" in ptx
    assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx
    assert all(cast in ptx for cast in build.casts), [line.strip() for line in ptx.splitlines() if "cvt." in line][:8]


def test_hardware_casts_shorten_the_gelu_kernel():
    """HW=True rounds with the FP8 conversion instruction; HW=False (the interpreter's path) rounds in integers:
    no such instruction, more instructions in all, the same loads and stores."""
    build = kernel_builds.BUILDS["gelu_rows"]
    hw, ints = (kernel_builds.compile_sm90(build, HW=flag) for flag in (True, False))
    assert "cvt.rn.satfinite.e4m3x2" in hw.asm["ptx"] and "e4m3x2" not in ints.asm["ptx"]
    hw, ints = kernel_builds.sass_stats(hw), kernel_builds.sass_stats(ints)
    assert hw["instructions"] < ints["instructions"]
    assert (hw["ldg"], hw["stg"]) == (ints["ldg"], ints["stg"])


def test_the_loss_tile_kernel_launches_with_hardware_casts_despite_the_recomputed_exps():
    """ce_kernel._ce_grad_e5m2 rounds with the hardware's cast on the GPU, the faster on an H200 (1.82 against
    2.00 ms per chunk) though its SASS is the heavier in one respect: Triton recomputes the exps in the transposed
    store's layout (more MUFU, more registers) while the integer rounding's shifts and logic go away."""
    build = kernel_builds.BUILDS["ce_grad_e5m2"]
    launched, ints = (kernel_builds.sass_stats(kernel_builds.compile_sm90(build, HW=flag)) for flag in (True, False))
    assert build.constants["HW"] is True and build.num_warps == 4
    assert launched["mufu"] > ints["mufu"] and launched["registers"] > ints["registers"]
    assert launched["instructions"] < ints["instructions"]


@pytest.mark.parametrize("sets", [['train.fp8="all"'], ['train.fp8="lm_head"', 'train.fp8_scaling="row"']])
def test_gelu_kernel_needs_per_row_fp8_blocks(sets):
    with pytest.raises(ConfigError, match="train.fp8_gelu_kernel"):
        load_pretrain_config(None, [*TINY, *sets, "train.fp8_gelu_kernel=true"])
    ok = load_pretrain_config(None, [*TINY, 'train.fp8="blocks"', 'train.fp8_scaling="row"',
                                     "train.fp8_gelu_kernel=true"])
    assert ok.train.fp8_gelu_kernel
