"""ce_kernel.py (train.loss_kernel='triton') on CPU: its cases (ce_kernel_cases.py) run under Triton's interpreter
in a pytest subprocess, since TRITON_INTERPRET must be set before triton is imported; here, the refusal to run
on CPU without it."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from scalelab.pretrain import ce_kernel  # noqa: E402
from tests.pretrain.interpreted import run_interpreted  # noqa: E402


def test_kernel_cases_under_the_interpreter():
    out = run_interpreted("tests/pretrain/ce_kernel_cases.py")
    assert "8 passed" in out  # every case ran: none skipped or deselected


def test_kernel_refuses_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    logits, targets = torch.zeros(2, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="loss_kernel='triton' runs on CUDA"):
        ce_kernel.cross_entropy_rows_(logits, targets, 8, 0.5, want_grad=True)
