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
    assert got == {"max_value_diff": 0.125, "max_code_diff": 2, "codes_equal": 0.5, "sign_flips": 0,
                   "max_flip_gap_of_row_max": 0.0, "max_scale_rel_diff": 0.5}


def test_sign_flip_is_measured_by_value_not_code(bench):
    # e4m3fn 0x08 = 2^-6, 0x88 = -2^-6, 0x40 = 2: a value on either side of 0 is 128 codes apart but only
    # 2 * 2^-6 / 2 = 2^-6 of the row's max
    values = torch.tensor([[0.015625, 2.0]], dtype=torch.bfloat16)
    ref = (values, torch.tensor([[0x08, 0x40]], dtype=torch.uint8).view(torch.float8_e4m3fn), torch.ones(1, 1))
    ours = (values, torch.tensor([[0x88, 0x40]], dtype=torch.uint8).view(torch.float8_e4m3fn), torch.ones(1, 1))
    got = bench.agreement(ours, ref)
    assert (got["max_code_diff"], got["sign_flips"], got["codes_equal"]) == (0, 1, 0.5)
    assert got["max_flip_gap_of_row_max"] == 0.015625
