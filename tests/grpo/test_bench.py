"""bench/grpo_rollout_bench.py in its CPU mode: the file it writes is what `grpo docs` reads."""
from __future__ import annotations

from scalelab.core.jsonio import read_json
from scalelab.grpo.docs import write_docs
from tests.bench_script import load_bench


def test_tiny_bench_feeds_the_docs(tmp_path):
    bench = load_bench("grpo_rollout_bench")
    out = tmp_path / "results" / "rollout_bench.json"
    assert bench.main(["--tiny", "--out", str(out)]) == 0
    r = read_json(out)
    hf = r["engines"]["hf"]
    # 2 prompts x 4 samples, at most 16 new tokens each
    assert r["batch"]["sequences"] == 8 and 8 <= hf["completion_tokens"] <= 8 * 16
    assert abs(hf["tokens_per_s"] - hf["completion_tokens"] / (hf["median_ms"] / 1e3)) < 1e-6 * hf["tokens_per_s"]
    # lengths fixed: every target is the cap; HF's static batch computes 8 rows x its longest row
    assert r["lengths"]["mode"] == "fixed" and not r["lengths"]["emulated"]
    assert (r["lengths"]["useful_tokens"], r["lengths"]["padded_tokens"], r["lengths"]["max"]) == (128, 128, 16)
    assert hf["computed_tokens"] % 8 == 0 and hf["completion_tokens"] <= hf["computed_tokens"] <= 8 * 16
    assert r["ratio_vllm_over_hf"] is None and r["update_ms"] > 0
    full, lora = r["weight_sync"]
    n_params = r["model"]["n_params"]
    assert full["bytes"] == lora["bytes"] == 4 * n_params  # fp32; the LoRA policy syncs merged full weights
    text = write_docs(tmp_path / "results", tmp_path / "grpo.md").read_text()
    assert f"| hf | {hf['tokens_per_s']:,.0f} | {hf['median_ms']:,.0f} | {hf['completion_tokens']:,} |" in text
    assert "| in-place, LoRA r=16 merged on the fly |" in text
