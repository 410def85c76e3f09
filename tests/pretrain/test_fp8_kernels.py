"""fp8_kernels.py (train.fp8_gelu_kernel) on CPU: its cases (fp8_kernel_cases.py) run under Triton's interpreter
in a pytest subprocess, since TRITON_INTERPRET must be set before triton is imported; here, the refusal to run on
CPU without it, and the config rules."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from scalelab.core.config import ConfigError  # noqa: E402
from scalelab.pretrain import fp8_kernels  # noqa: E402
from scalelab.pretrain.config import load_pretrain_config  # noqa: E402
from tests.pretrain.interpreted import run_interpreted  # noqa: E402
from tests.pretrain.test_train_gpt import TINY  # noqa: E402


def test_kernel_cases_under_the_interpreter():
    out = run_interpreted("tests/pretrain/fp8_kernel_cases.py")
    assert "5 passed" in out  # every case ran: none skipped or deselected


def test_kernels_refuse_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="fp8_gelu_kernel runs on CUDA"):
        fp8_kernels.gelu_rows(torch.zeros(2, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("sets", [['train.fp8="all"'], ['train.fp8="lm_head"', 'train.fp8_scaling="row"']])
def test_gelu_kernel_needs_per_row_fp8_blocks(sets):
    with pytest.raises(ConfigError, match="train.fp8_gelu_kernel"):
        load_pretrain_config(None, [*TINY, *sets, "train.fp8_gelu_kernel=true"])
    ok = load_pretrain_config(None, [*TINY, 'train.fp8="blocks"', 'train.fp8_scaling="row"', "train.fp8_gelu_kernel=true"])
    assert ok.train.fp8_gelu_kernel
