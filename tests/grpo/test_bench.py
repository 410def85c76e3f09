"""bench/grpo_rollout_bench.py in its CPU mode: the file it writes is what `grpo docs` reads."""
from __future__ import annotations

import json

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


def test_profile_call_names_where_the_time_went(tmp_path):
    """The profile of a generate call whose time is one busy function: it leads the own-time table with most of the
    wall-clock, and the text file is written."""
    bench = load_bench("grpo_rollout_bench")

    def busy(n):
        return sum(i * i for i in range(n))

    def generate(prompts, params):
        return [busy(300_000) for _ in prompts]

    out = bench.profile_call(generate, [[1], [2], [3]], None, str(tmp_path / "prof.txt"))
    top = out["top_tottime"]
    assert "busy" in top[0]["function"] or "genexpr" in top[0]["function"]
    assert sum(r["share"] for r in top) <= 1.0 + 1e-6 and out["wall_s"] > 0
    assert "under cProfile" in (tmp_path / "prof.txt").read_text()


def test_engines_argument_refuses_two_vllm_engines_in_one_process():
    bench = load_bench("grpo_rollout_bench")
    import pytest
    for bad in ("hf,vllm_colocated,vllm_standalone", "hf,sglang"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--engines", bad, "--out", "x.json"])
    assert bench.parse_args(["--engines", "hf,vllm_standalone", "--task", "gsm8k", "--out", "x"]).task == "gsm8k"


def test_hf_without_logits_samples_what_the_engine_samples(tmp_path):
    """The speed baseline without kept logits draws the same tokens as the trainer's HF engine (same seed, same
    generation config otherwise), so the two time the same work."""
    bench = load_bench("grpo_rollout_bench")
    plain = tmp_path / "plain.json"
    kept = tmp_path / "kept.json"
    assert bench.main(["--tiny", "--no-update", "--no-sync", "--out", str(kept)]) == 0
    assert bench.main(["--tiny", "--no-update", "--no-sync", "--hf-logprobs", "none", "--out", str(plain)]) == 0
    a, b = read_json(kept), read_json(plain)
    assert a["engines"]["hf"]["completion_tokens"] == b["engines"]["hf"]["completion_tokens"]
    assert a["answer_lengths"] == b["answer_lengths"]


def test_rollout_table_pairs_colocated_with_its_standalone_ceiling(tmp_path):
    """Two runs of the same batch, one per vLLM engine: the table divides their vLLM rates (24,000 / 30,000 = 80%)
    and shows the two HF baselines' ratio (6,000 / 5,000 = 1.20); a run of another batch gets no share."""
    table = load_bench("rollout_bench_table")
    base = {"model": {"name": "m"}, "task": "gsm8k", "ratio_vllm_over_hf": None,
            "batch": {"prompts": 64, "group_size": 8, "sequences": 512, "max_new_tokens": 512, "temperature": 1.0,
                      "top_p": 1.0},
            "vllm_options": {"requested": {"gpu_memory_utilization": 0.15}},
            "answer_lengths": {"mean": 300.0, "p90": 480.0, "at_cap_frac": 0.03}}

    def run(engine, hf, vllm, prompts=64):
        r = json.loads(json.dumps(base))
        r["batch"]["prompts"] = prompts
        r["engines"] = {"hf": {"tokens_per_s": hf}, engine: {"tokens_per_s": vllm}}
        r["ratio_vllm_over_hf"] = vllm / hf
        return r

    for name, r in {"a-colocated": run("vllm_colocated", 6000.0, 24000.0),
                    "b-standalone": run("vllm_standalone", 5000.0, 30000.0),
                    "c-other": run("vllm_colocated", 6000.0, 12000.0, prompts=32)}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    out = tmp_path / "t.md"
    assert table.main([str(tmp_path), "--out", str(out)]) == 0
    lines = {line.split(" | ")[0].lstrip("| "): line for line in out.read_text().splitlines()[2:]}
    assert lines["a-colocated"].endswith("| 4.00x | 80% (1.20) |")
    assert lines["b-standalone"].endswith("| 6.00x | - |") and lines["c-other"].endswith("| 2.00x | - |")
    assert "300 / 480 (3.0%)" in lines["a-colocated"]
