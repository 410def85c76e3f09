"""The serve page's client check: one table per crosscheck file, its verdicts as recorded, a missing file named."""
from __future__ import annotations

from scalelab.core.jsonio import write_json
from scalelab.serve.harness_doc import HEADING, harness_md


def _crosscheck(rate: float | None) -> dict:
    med = {"output_tokens_per_s": 100.0, "ttft_p50_ms": 50.0}
    return {"provenance": {"vllm_version": "0.26.0", "hardware": {"gpus": ["NVIDIA H100 80GB HBM3"], "cpu_count": 16}},
            "config": {"rate": rate, "concurrency": 8, "num_prompts": 520, "repeats": 3, "output_tokens": 256},
            "goal_ratio_tolerance": 0.05,
            "median_over_repeats": {"ours": med, "vllm_bench": {"output_tokens_per_s": 97.0, "ttft_p50_ms": 55.0},
                                    "vllm_raw_ours_metrics": {"output_tokens_per_s": 99.5, "ttft_p50_ms": 55.0}},
            "ratios_of_medians": {"ours/vllm_bench": {"output_tokens_per_s": 1.0309, "ttft_p50_ms": 0.9091},
                                  "vllm_raw_ours_metrics/vllm_bench": {"output_tokens_per_s": 1.0258,
                                                                       "ttft_p50_ms": 1.0}},
            "within_tolerance": {"output_tokens_per_s": True, "ttft_p50_ms": False},
            "within_spread": {"output_tokens_per_s": True, "ttft_p50_ms": True},
            "within_goal": {"output_tokens_per_s": True, "ttft_p50_ms": False}}


def test_one_table_per_file_with_the_recorded_verdicts(tmp_path):
    write_json(tmp_path / "gpu.json", _crosscheck(26.0))
    write_json(tmp_path / "cpu.json", {**_crosscheck(None), "provenance": {"hardware": {"cpu_count": 2}}})
    lines = harness_md([(tmp_path / "gpu.json", "results/gpu.json"), (tmp_path / "cpu.json", "results/cpu.json"),
                        (tmp_path / "none.json", "results/none.json")])
    text = "\n".join(lines)
    assert lines[0] == HEADING
    assert ("`results/gpu.json`: 1 x NVIDIA H100 80GB HBM3, vLLM 0.26.0; Poisson 26 req/s, 520 prompts, 3 repeats"
            in text)
    assert "`results/cpu.json`: a 2-core CPU, vLLM (version not recorded); closed loop, 8 in flight" in text
    assert ("| output tok/s | 100.00 | 97.00 | 1.031 | 1.026 | met (within 5%: yes; within the repeat range: yes) |"
            in lines)
    assert "| p50 TTFT (ms) | 50.00 | 55.00 | 0.909 | 1.000 | not met (within 5%: no; within the repeat range: yes) |" \
        in lines
    assert "- `results/none.json`: not measured yet (no such file)." in lines


def test_no_files_no_section():
    assert harness_md([]) == []


def test_each_repeat_and_the_request_pairing_follow_the_table(tmp_path):
    rows = [{"client": c, "repeat": k, "ttft_p50_ms": v} for c, k, v in
            [("ours", 0, 31.51), ("vllm_bench", 0, 34.64), ("vllm_raw_ours_metrics", 0, 34.64),
             ("vllm_bench", 1, 34.75), ("ours", 1, 37.71)]]
    paired = {"repeats": [{"repeat": 0, "pairs": 517, "unpaired": 3, "ttft_diff_ms_median": -3.042,
                           "ttft_diff_ms_mean": -3.534, "ttft_diff_ms_p10_p90": [-12.6, 5.004],
                           "share_ours_longer": 0.3191},
                          {"repeat": 1, "pairs": 520, "ttft_diff_ms_median": 1.66, "ttft_diff_ms_mean": 3.139,
                           "ttft_diff_ms_p10_p90": [-8.064, 18.046], "share_ours_longer": 0.5996}],
              "one_sign_in_every_repeat": False}
    write_json(tmp_path / "x.json", {**_crosscheck(26.0), "rows": rows, "paired_ttft": paired})
    lines = harness_md([(tmp_path / "x.json", "x.json")])
    assert "p50 TTFT (ms) by repeat, ours / vllm bench: 31.5 / 34.6, 37.7 / 34.8." in lines
    assert "Request by request (the same prompt in one repeat's two runs): no common sign across repeats." in lines
    assert "| 0 | 517 (3) | -3.0 | -3.5 | -12.6 / +5.0 | 32% |" in lines
    assert "| 1 | 520 (0) | +1.7 | +3.1 | -8.1 / +18.0 | 60% |" in lines
    # a file without them (the CPU checks) gets neither
    write_json(tmp_path / "y.json", _crosscheck(26.0))
    assert not any("by repeat" in ln or "Request by request" in ln for ln in harness_md([(tmp_path / "y.json", "y")]))
