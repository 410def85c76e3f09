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

triton = pytest.importorskip("triton")

from scalelab.core.config import ConfigError  # noqa: E402
from scalelab.pretrain import ce_kernel, fp8_kernels  # noqa: E402
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


# (kernel, signature, compile-time constants) at the 124M recipe's shapes: pointers, then scalars, then constexprs
HOPPER_CASES = {
    "gelu_rows": (lambda: fp8_kernels._GELU_ROWS, "*bf16 *bf16 *u8 *fp32", {"N": 3072, "BLOCK": 4096, "K": 0.8}),
    "gelu_grad_rows": (lambda: fp8_kernels._GELU_GRAD_ROWS, "*bf16 *bf16 *bf16 *u8 *fp32",
                       {"N": 3072, "BLOCK": 4096, "K": 0.8}),
    "ce_rows": (lambda: ce_kernel._CE_ROWS, "*bf16 i64 *i64 *fp32 *fp32 fp32",
                {"VOCAB": 50257, "PADDED": 50304, "WANT_GRAD": True, "BLOCK": 4096}),
    "ce_grad_e5m2": (lambda: ce_kernel._CE_GRAD_E5M2, "*bf16 i64 *fp32 *i64 *u8 *u8 i32",
                     {"VOCAB": 50257, "PADDED": 50304, "SCALE": 57344.0, "BR": 64, "BV": 128}),
}


@pytest.mark.parametrize("name", HOPPER_CASES)
def test_kernels_compile_for_hopper(name):
    """Triton compiles for sm_90 with its own ptxas, no GPU needed: what the CPU interpreter cannot check (types
    the compiler refuses, layouts it cannot lower) fails here, before any GPU time. Given the launch's
    specialization of 16-divisible pointers and strides, the row loads must come out as 16-byte vector loads."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    get, types, constants = HOPPER_CASES[name]
    kernel = get()
    args = [a for a in kernel.arg_names if a not in constants]
    signature = {**dict(zip(args, types.split(), strict=True)), **{c: "constexpr" for c in constants}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types.split()) if t.startswith("*") or t == "i64"}
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]
    assert "ld.global.v4" in compiled.asm["ptx"] or "ld.global.nc.v4" in compiled.asm["ptx"]


@pytest.mark.parametrize("sets", [['train.fp8="all"'], ['train.fp8="lm_head"', 'train.fp8_scaling="row"']])
def test_gelu_kernel_needs_per_row_fp8_blocks(sets):
    with pytest.raises(ConfigError, match="train.fp8_gelu_kernel"):
        load_pretrain_config(None, [*TINY, *sets, "train.fp8_gelu_kernel=true"])
    ok = load_pretrain_config(None, [*TINY, 'train.fp8="blocks"', 'train.fp8_scaling="row"',
                                     "train.fp8_gelu_kernel=true"])
    assert ok.train.fp8_gelu_kernel
