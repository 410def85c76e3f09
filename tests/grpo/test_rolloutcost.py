"""Per-decode-step costs from rollout-bench files: the roofline floor by hand, fixed lengths only, and the
sentences the table supports."""
from __future__ import annotations

import pytest

from scalelab.core.hardware import get_hardware
from scalelab.grpo.rolloutcost import gpu_floor_ms, step_cost_lines, step_costs


def bench(sequences: int, hf_ms: float, vllm_ms: float | None, core: str = "inprocess", new: int = 100,
          emulated: bool = False, n_params: int = 1_000_000_000) -> dict:
    engines = {"hf": {"median_ms": hf_ms}}
    if vllm_ms is not None:
        engines["vllm_colocated"] = {"median_ms": vllm_ms}
    return {"batch": {"sequences": sequences, "max_new_tokens": new}, "engines": engines,
            "model": {"n_params": n_params}, "lengths": {"emulated": emulated},
            "vllm_options": {"effective": {"engine_core": core, "flat_logprobs": True,
                                           "max_cudagraph_capture_size": sequences}}}


def test_floor_is_the_larger_of_compute_and_weight_reads():
    hw = get_hardware("h200")  # 989.4 TFLOP/s dense bf16, 4.8 TB/s
    # 1e9 params x 2 B = 2 GB / 4.8 TB/s = 0.4167 ms; 2e9 x 64 FLOPs = 1.28e11 / 989.4e12 = 0.129 ms
    assert gpu_floor_ms(1_000_000_000, 64, hw) == pytest.approx(2e9 / 4.8e12 * 1e3)
    # at 1,024 sequences compute wins: 2.048e12 / 989.4e12 = 2.07 ms
    assert gpu_floor_ms(1_000_000_000, 1024, hw) == pytest.approx(2.048e12 / 989.4e12 * 1e3)


def test_only_fixed_length_files_and_per_step_division():
    costs = step_costs([("a.json", bench(256, 2000.0, 1000.0)), ("b.json", bench(256, 1.0, 1.0, emulated=True))])
    assert [c.label for c in costs] == ["a.json"]
    assert (costs[0].hf_ms, costs[0].vllm_ms) == (20.0, 10.0)  # 100 steps per batch


def test_reading_names_growth_spread_and_the_core_split():
    costs = step_costs([("small.json", bench(256, 2000.0, 1000.0)),
                        ("in.json", bench(1024, 4000.0, 5000.0)),
                        ("mp.json", bench(1024, 4000.0, 5200.0, core="subprocess")),
                        ("slow-host.json", bench(256, 4000.0, None))])
    text = "\n".join(step_cost_lines(costs))
    # 10 ms -> 50 ms over 768 more sequences = 52 us each
    assert "grows from 10.0 ms at 256 sequences to 50.0 ms at 1,024 (~52 us per extra running sequence)" in text
    assert "HF's step at 256 sequences: 20.0 to 40.0 ms" in text
    assert "was 1.30x HF's step in the same run, against 1.25x in process" in text
    assert "engine core's own loop" in text
    assert "| mp.json | 1,024 | 40.0 | 52.0 | subprocess |" in text


def test_no_vllm_no_reading():
    costs = step_costs([("hf-only.json", bench(256, 2000.0, None))])
    lines = step_cost_lines(costs)
    assert lines and not any("grows from" in line for line in lines)
    assert step_cost_lines([]) == []
