"""bench/gpu_row_kernels.py's agreement check (the timing itself is a GPU benchmark): value, FP8-code and scale
gaps between a kernel's outputs and the reference's, by hand."""
from __future__ import annotations

import pytest
import torch

from tests.bench_script import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("gpu_row_kernels")  # which imports gpu_fp8_gemm beside it


def test_agreement_by_hand(bench):
    values = torch.tensor([[1.0, -2.0], [0.5, 0.25]], dtype=torch.bfloat16)
    codes = torch.tensor([[10, 20], [30, 40]], dtype=torch.uint8)
    scales = torch.tensor([[1.0], [2.0]])
    other = torch.tensor([[10, 22], [30, 39]], dtype=torch.uint8)  # one code 2 apart, one 1 apart
    ref = (values, codes.view(torch.float8_e4m3fn), scales)
    ours = (values + torch.tensor([[0.0, 0.0], [0.0, 0.125]], dtype=torch.bfloat16),
            other.view(torch.float8_e4m3fn), scales * torch.tensor([[1.0], [1.5]]))
    got = bench.agreement(ours, ref)
    assert got == {"max_value_diff": 0.125, "max_code_diff": 2, "codes_equal": 0.5, "max_scale_rel_diff": 0.5}
