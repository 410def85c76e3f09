"""The real-model bench blocks of `scalelab grpo docs MANIFEST` (grpo.docs_bench) from hand-made bench files: one
row per file and variant, the files that are not bench outputs passed over, and a colocated engine's share of the
standalone one on the same batch, worked out by hand."""
from __future__ import annotations

import copy

from scalelab.core.jsonio import write_json
from tests.grpo.test_docs import BENCH
from tests.grpo.test_docs_blocks import page


def update_file(variants: dict[str, tuple[float, float, float]], tflops: float = 800.0) -> dict:
    """bench/grpo_update_bench.py's output: variant -> (update s, reference s, peak GiB); N = 500M, 100,000 tokens:
    update MFU = 6 x 500e6 x 1e5 / update s / (tflops x 1e12)."""
    n, tokens = 500e6, 100_000
    return {"gpu": "NVIDIA H100", "shape": "qwen2.5-0.5b", "matmul_bf16_tflops": tflops, "n_linear_params": n,
            "sequences": 256, "tokens": tokens, "completion_tokens": 80_000, "variants": {
                name: {"passes": 9, "padded_tokens": 110_000, "update_s": u, "reference_s": r, "update_s_all": [u],
                       "peak_mem_gib": gib, "update_mfu": 6 * n * tokens / u / (tflops * 1e12),
                       "mfu": 8 * n * tokens / (u + r) / (tflops * 1e12)}
                for name, (u, r, gib) in variants.items()}}


def test_update_bench_one_row_per_file_and_variant_other_files_passed_over(tmp_path):
    folder = tmp_path / "results" / "ub"
    # 6 x 5e8 x 1e5 = 3e14 FLOPs: in 1.5 s at 800 TFLOP/s -> 25.0%; with a 0.5 s reference 4e14 / 2 s -> 25.0%
    write_json(folder / "2-b.json", update_file({"eager": (1.5, 0.5, 23.34)}))
    write_json(folder / "1-a.json", update_file({"fixed": (3.0, 1.0, 31.0), "budget": (2.0, 0.5, 20.0)}, 750.0))
    write_json(folder / "provenance.json", {"runs": {"1-a.json": {}}})
    write_json(folder / "predictions.json", {"budget-chunked": {"update_s": 1.6}})
    (folder / "1-a.log").write_text("not json")
    text = page(tmp_path, '[[page]]\nsection = "update_bench"\nfolder = "ub"\n')
    rows = [line for line in text.splitlines() if line.startswith(("| 1-a", "| 2-b"))]
    # 3e14 / 3.0 s / 750e12 = 13.3%; 4e14 / 4.0 s / 750e12 = 13.3%; 3e14 / 2.0 / 750e12 = 20.0%, 4e14 / 2.5 -> 21.3%
    same = "| NVIDIA H100 | 9 | 100,000 (110,000) |"
    assert rows == [f"| 1-a.json | fixed {same} 3.00 | 1.00 | 13.3% | 13.3% | 31.0 | 750 |",
                    f"| 1-a.json | budget {same} 2.00 | 0.50 | 20.0% | 21.3% | 20.0 | 750 |",
                    f"| 2-b.json | eager {same} 1.50 | 0.50 | 25.0% | 25.0% | 23.3 | 800 |"]
    assert "N = 500M linear weights" in text and "| provenance.json" not in text and "| predictions.json" not in text


def real_bench(engine: str, vllm_tps: float, hf_tps: float, memory: float = 0.15) -> dict:
    b = copy.deepcopy(BENCH)
    b["model"].update(name="qwen2.5-coder-0.5b-instruct-q4km", random_weights=False)
    b["task"] = "gsm8k"
    b["engines"] = {"hf": {"tokens_per_s": hf_tps}, engine: {"tokens_per_s": vllm_tps}}
    b["ratio_vllm_over_hf"] = vllm_tps / hf_tps
    b["answer_lengths"] = {"mean": 305.4, "at_cap_frac": 0.031}
    b["vllm_options"] = {"requested": {"gpu_memory_utilization": memory}}
    return b


def test_rollout_real_ratios_and_the_colocated_share_of_the_standalone_engine(tmp_path):
    """Colocated 6,000 tok/s against standalone 8,000 on the same batch: 75%; against its own HF 1,500: 4.00x. The
    standalone run at another memory share is not the same batch; the random-weight file is not the real model."""
    folder = tmp_path / "results" / "rb"
    write_json(folder / "real-colocated.json", real_bench("vllm_colocated", 6000.0, 1500.0))
    write_json(folder / "real-standalone.json", real_bench("vllm_standalone", 8000.0, 1600.0))
    write_json(folder / "real-standalone-0.3.json", real_bench("vllm_standalone", 9000.0, 1600.0, memory=0.3))
    write_json(folder / "fixed1024-colocated.json", BENCH)
    text = page(tmp_path, '[[page]]\nsection = "rollout_real"\nfolder = "rb"\n')
    assert ("| real-colocated.json | qwen2.5-coder-0.5b-instruct-q4km | 256 x 32 | 305 (3.1%) | 1,500 | vllm_colocated "
            "| 6,000 | 4.00x | 75% of real-standalone.json |") in text
    assert "| real-standalone.json | qwen2.5-coder-0.5b-instruct-q4km | 256 x 32 | 305 (3.1%) | 1,600 | " \
           "vllm_standalone | 8,000 | 5.00x | — |" in text
    assert "fixed1024" not in text


def test_rollout_real_folder_of_random_weights_only_says_not_measured(tmp_path):
    write_json(tmp_path / "results" / "rb" / "fixed1024-colocated.json", BENCH)
    text = page(tmp_path, '[[page]]\nsection = "rollout_real"\nfolder = "rb"\n')
    assert "Not measured yet: no bench/grpo_rollout_bench.py file of a real model in `results/rb`." in text
