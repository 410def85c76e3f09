"""bench/grpo_update_bench.py at a tiny shape on the CPU: the batch it builds has the logged step's lengths, the
length-sorted passes pad less than fixed slices, its MFU is the stated formula of what it timed, and the
compiled-layers variant (GPU only) is listed as skipped."""
from __future__ import annotations

import json
import platform

import pytest
import torch

from tests.bench_script import load_bench


def test_tiny_update_bench(tmp_path):
    lengths = [3, 40, 7, 22, 5, 31, 9, 2] * 2  # two prompts x 8 samples
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"event": "grpo_step", "step": 0, "completion_lengths": lengths,
                                   "update_tokens": sum(lengths) + 16 * 20}) + "\n")
    out = tmp_path / "bench.json"
    assert load_bench("grpo_update_bench").main(["--metrics", str(metrics), "--shape", "tiny", "--reps", "1",
                                                 "--budget-tokens", "200", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sequences"] == 16 and r["completion_tokens"] == sum(lengths)
    assert r["host"]["kernel_release"] == platform.release() and 0 < r["host"]["launch_us"] < 1e5
    v = r["variants"]
    ran = ["fixed8-full", "fixed8-chunked", "budget-chunked-fp32lora", "budget-chunked-eager", "budget-chunked"]
    if torch.cuda.is_available():
        assert list(v) == [*ran, "budget-chunked-layers"] and "skipped" not in r
    else:
        assert list(v) == ran
        assert "GPU option" in r["skipped"]["budget-chunked-layers"]  # torch.compile of the layers: not on the CPU
    assert v["fixed8-full"]["passes"] == v["fixed8-chunked"]["passes"] == 2
    assert v["budget-chunked"]["padded_tokens"] < v["fixed8-full"]["padded_tokens"]
    for x in v.values():
        assert x["padded_tokens"] >= r["tokens"]
        want = 6 * r["n_linear_params"] * r["tokens"] / x["update_s"] / (r["matmul_bf16_tflops"] * 1e12)
        assert x["update_mfu"] == pytest.approx(want)


def test_a_metrics_file_without_the_step_is_named(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"event": "grpo_step", "step": 3, "completion_lengths": [1],
                                   "update_tokens": 5}) + "\n")
    with pytest.raises(SystemExit, match="no grpo_step record for step 0"):
        load_bench("grpo_update_bench").main(["--metrics", str(metrics), "--shape", "tiny"])
