"""Per-decode-step costs from rollout-bench files: the roofline floor by hand, fixed lengths only, and the
sentences the table supports."""
from __future__ import annotations

import pytest

from scalelab.core.hardware import get_hardware
from scalelab.grpo.rolloutcost import gpu_floor_ms, step_cost_lines, step_costs


def bench(sequences: int, hf_ms: float, vllm_ms: float | None, core: str = "inprocess", new: int = 100,
          emulated: bool = False, n_params: int = 1_000_000_000, model: str = "m1b") -> dict:
    engines = {"hf": {"median_ms": hf_ms}}
    if vllm_ms is not None:
        engines["vllm_colocated"] = {"median_ms": vllm_ms}
    return {"batch": {"sequences": sequences, "max_new_tokens": new}, "engines": engines,
            "model": {"name": model, "n_params": n_params}, "lengths": {"emulated": emulated},
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
    assert "| mp.json | m1b | 1,024 | 40.0 | 52.0 | subprocess |" in text


def test_ceiling_is_hf_over_the_floor_and_models_are_read_apart():
    """1B at 256 sequences: floor = max(2e9 x 256 / 989.4e12 = 0.5175 ms, 2e9 / 4.8e12 = 0.4167 ms) = 0.5175 ms;
    HF 20 ms/step -> ceiling 38.6x. 5B at 256: floor = 2.5875 ms, HF 10 ms -> 3.9x; vLLM 5 ms -> reached 2.00x.
    The 5B step (5 ms) is compared with the 1B step (10 ms), never folded into the 1B growth reading."""
    costs = step_costs([("a.json", bench(256, 2000.0, 1000.0)),
                        ("b.json", bench(1024, 4000.0, 5000.0)),
                        ("big.json", bench(256, 1000.0, 500.0, n_params=5_000_000_000, model="m5b"))])
    text = "\n".join(step_cost_lines(costs))
    assert "| big.json | m5b | 256 | 10.0 | 5.0 | inprocess | 2.59 | 1.9x | 3.9x |" in text
    assert "m1b: vLLM's fastest step grows from 10.0 ms at 256 sequences" in text  # not the 5B file's 5.0 ms
    assert "m1b at 256 sequences 38.6x (vLLM reached 2.00x)" in text
    assert "m5b at 256 sequences 3.9x (vLLM reached 2.00x)" in text
    assert "10.0 ms for m1b and 5.0 ms for m5b, 5.0x the parameters: the step took 0.50x as long" in text


def test_no_vllm_no_reading():
    costs = step_costs([("hf-only.json", bench(256, 2000.0, None))])
    lines = step_cost_lines(costs)
    assert lines and not any("grows from" in line for line in lines)
    assert step_cost_lines([]) == []
