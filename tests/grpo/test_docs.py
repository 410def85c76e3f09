"""docs/grpo.md from a hand-made results folder: every number below is worked out by hand from the files, and
a folder without a result says "Not measured yet" for that section."""
from __future__ import annotations

from scalelab.cli import main
from scalelab.core.jsonio import write_json
from scalelab.grpo.docs import write_docs
from scalelab.grpo.seeds import aggregate
from tests.grpo.test_report import make_run
from tests.grpo.test_studies import _summary

# vLLM 4x the tokens/s of HF; step = 2,048 (vLLM rollout) + 3,000 (update) + 52 (sync) = 5,100 ms -> 1.02%
BENCH = {"model": {"name": "qwen2.5-1.5b (random)", "n_params": 1.54e9, "dtype": "bfloat16", "random_weights": True},
         "device": "NVIDIA H200",
         "batch": {"prompts": 32, "group_size": 8, "sequences": 256, "prompt_tokens_mean": 40.0,
                   "max_new_tokens": 32, "temperature": 1.0, "top_p": 1.0},
         "engines": {"hf": {"tokens_per_s": 1000.0, "median_ms": 8192.0, "completion_tokens": 8192},
                     "vllm_colocated": {"tokens_per_s": 4000.0, "median_ms": 2048.0, "completion_tokens": 8192}},
         "ratio_vllm_over_hf": 4.0, "update_ms": 3000.0,
         "weight_sync": [{"label": "in-place, full weights", "median_ms": 52.0, "bytes": 3 * 2**30}]}


def staleness() -> dict:
    def variant(name, k, reward, held):
        series = {"reward_mean": [0.1, reward], "loss": [0.0, 0.1], "kl_mean": [0.0, 0.0],
                  "behavior_mismatch_k3": [0.0, 1e-3 * k]}
        return {"name": name, "k": k, "is_correction": False, "run_dir": name, "steps": [0, 1], "series": series,
                "final": {"reward_first_quarter": 0.1, "reward_last_quarter": reward, "kl_last_quarter": 0.0,
                          "mismatch_last_quarter": 1e-3 * k, "median_step_ms": 900.0,
                          "median_overlapped_step_ms": 600.0,
                          "heldout": {"metric": "greedy_pass1", "base": 14.0, "trained": held, "delta": held - 14.0,
                                      "ci_low": held - 17.0, "ci_high": held - 11.0}}}
    return {"name": "abl", "variants": [variant("k0", 0, 0.5, 22.0), variant("k4", 4, 0.45, 18.5)]}


def hacking() -> dict:
    flag = lambda hit: {"name": "length growth without accuracy growth", "checked": True, "triggered": hit,  # noqa
                        "detail": ""}
    arm = lambda n, hit, l1, c1: {"name": n, "flags": [flag(hit)], "correctness_first": 0.1,  # noqa: E731
                                  "correctness_last": c1, "len_mean_first": 5.0, "len_mean_last": l1,
                                  "heldout": None}
    return {"name": "hack", "exploit": "length", "defense": "gate", "target_chars": 32, "exploit_weight": 1.0,
            "arms": [arm("exploit", True, 15.0, 0.1), arm("defended", False, 5.5, 0.3)],
            "lengths": {"exploit": {"first_quarter": [4, 5, 6], "last_quarter": [14, 15, 16]},
                        "defended": {"first_quarter": [4, 5, 6], "last_quarter": [5, 5, 6]}},
            "verdict": {"works": True, "reasons": ["exploit arm flagged", "defended arm not flagged"]}}


def test_docs_from_a_full_results_folder(tmp_path):
    results = tmp_path / "results"
    make_run(results)  # results/hand: the report test's run, GPU samples included
    write_json(results / "bench" / "rollout_bench.json", BENCH)
    write_json(results / "seeds.json", aggregate({0: _summary(0.14, 0.20, 0.01, 0.11), 1: _summary(0.14, 0.22, 0.03,
                                                  0.13), 2: _summary(0.14, 0.24, 0.05, 0.15)}))
    write_json(results / "abl" / "staleness.json", staleness())
    write_json(results / "hack" / "hacking.json", hacking())
    out = tmp_path / "docs" / "grpo.md"
    assert main(["grpo", "docs", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    for expected in (
            "| rollout | 1,050.0 | 65.0% |", "rollout takes 65.0% of a step",  # the run's shares (test_report)
            "2 dead zone(s)", "totalling 3.0 s (60.0% of the sampled time",  # 1.5 s + 1.5 s of 5.0 s
            "vLLM generates **4.00x** the tokens/s", "(1.54B parameters", "| vllm_colocated | 4,000 | 2,048 | 8,192 |",
            "| rollout_bench.json | in-place, full weights | inprocess | 52.0 | 3,072.0 | 2,048 + 3,000 | 1.02% |",
            "| k4 | 0.450 | 4.00e-03 | 600 | 18.5% (+4.5) |",
            "**Verdict: the defense works**", "| exploit | 5.0 -> 15.0 | 10.0 -> 10.0 | FLAGGED |",
            "mean gain **+8.0 points** over 3 seeds, 95% t interval +3.0 to +13.0"):
        assert expected in text, expected
    assert "Not measured yet" not in text
    for name in ("grpo_step_time", "grpo_gpu", "grpo_rollout_throughput", "grpo_weight_sync",
                 "grpo_staleness_curves", "grpo_staleness_final", "grpo_hacking_lengths"):
        assert (tmp_path / "docs" / "figures" / f"{name}.png").stat().st_size > 5_000
        assert f"(figures/{name}.png)" in text


def test_absent_results_say_not_measured_yet(tmp_path):
    write_json(tmp_path / "r" / "rollout_bench.json", {**BENCH, "weight_sync": []})
    text = write_docs(tmp_path / "r", tmp_path / "grpo.md").read_text()
    for section in ("## Step time by phase", "## GPU utilization and dead zones", "## Weight-sync cost",
                    "## Staleness", "## Reward hacking", "## Held-out pass@1 across seeds"):
        body = text.split(section, 1)[1].split("\n", 1)[1].split("\n## ", 1)[0]
        assert body.strip().startswith("Not measured yet"), section
    assert "**4.00x**" in text and "figures/grpo_step_time.png" not in text


def test_other_bench_files_get_their_own_rows_and_the_goal_verdict(tmp_path):
    """A second bench file (another batch, with the vLLM options it ran with) is tabled beside the main one; the
    goal verdict uses the best ratio over every file: max(4.0, 1200 / 2000 = 0.6) = 4.00 < 5."""
    import copy
    write_json(tmp_path / "rollout_bench.json", BENCH)
    other = copy.deepcopy(BENCH)
    other["batch"].update(prompts=64, group_size=16, sequences=1024)
    other["engines"]["hf"]["tokens_per_s"], other["engines"]["vllm_colocated"]["tokens_per_s"] = 2000.0, 1200.0
    other["ratio_vllm_over_hf"] = 0.6
    other["vllm_options"] = {"effective": {"flat_logprobs": True, "max_cudagraph_capture_size": 1024}}
    write_json(tmp_path / "variants" / "64x16-flat-graphs.json", other)
    text = write_docs(tmp_path, tmp_path / "docs" / "grpo.md").read_text()
    assert "| variants/64x16-flat-graphs.json | 1,024 x 32 | fixed | 2,000 | 1,200 | 0.60 | True | 1024 | inprocess |" in text
    assert ("Best vLLM / HF ratio over these files: **4.00x** (rollout_bench.json); with fixed lengths: **4.00x** "
            "(rollout_bench.json); goal >= 5x: not met.") in text
    # a long-tailed file over the goal: met only there, and the verdict says so
    tailed = copy.deepcopy(other)
    tailed["ratio_vllm_over_hf"] = 6.0
    tailed["lengths"] = {"emulated": True, "mode": "lognormal", "mean": 200.0, "max_over_mean": 3.0}
    write_json(tmp_path / "variants" / "64x16-lognormal.json", tailed)
    text = write_docs(tmp_path, tmp_path / "docs" / "grpo.md").read_text()
    assert ("**6.00x** (variants/64x16-lognormal.json); with fixed lengths: **4.00x** (rollout_bench.json); goal >= "
            "5x: met only with long-tailed lengths (lognormal (mean 200, max/mean 3.0)), not with fixed lengths.") in text


def _server_sync(shape: str, err: tuple[float, float], restored_diff: float = 0.0) -> dict:
    timing = lambda m, ms: {"method": m, "bytes": 3_000_000_000, "first_ms": 2 * ms, "median_ms": ms,  # noqa: E731
                            "runs_ms": [ms], "gb_per_s": 3.0 / ms * 1e3}
    check = lambda m, e: {"method": m, "changed": True, "max_hf_logprob_err": e, "restored_tokens_equal": True,  # noqa
                          "max_restored_logprob_diff": restored_diff, "ok": e <= 0.1 and restored_diff <= 1e-3}
    return {"model": {"shape": shape}, "tol": 0.1, "timings": [timing("nccl", 100.0), timing("safetensors", 1500.0)],
            "checks": [check("nccl", err[0]), check("safetensors", err[1])]}


def test_server_syncs_are_tabled_with_their_share_of_a_step_and_the_check_read_right(tmp_path):
    """NCCL 100 ms vs a 1,500 ms reload = 15.0x; the same-shape bench's step: vLLM rollout 2,048 + update 3,000 =
    5,048 ms, so the sync is 100 / 5,148 = 1.9%. An equal miss of the tolerance by both methods with an exact
    restore is read as the engines' forward gap; unequal errors are a failed check."""
    import copy
    bench = copy.deepcopy(BENCH)
    bench["model"]["name"] = "random:tiny"
    write_json(tmp_path / "rollout_bench.json", bench)
    write_json(tmp_path / "nccl" / "a.json", _server_sync("tiny", (0.05, 0.05)))
    write_json(tmp_path / "nccl" / "b.json", _server_sync("big", (0.2, 0.2)))
    write_json(tmp_path / "nccl" / "c.json", _server_sync("big", (0.02, 0.3)))
    text = write_docs(tmp_path, tmp_path / "docs" / "grpo.md").read_text()
    assert "| nccl/a.json | tiny | nccl | 100.0 | 200 | 3.00 | 30.0 | 0.050 (tol 0.1) | yes | exact | ok |" in text
    assert "tiny: NCCL 100 ms against 1,500 ms for the file reload, 15.0x faster." in text
    assert "(rollout + update 5,048 ms) an NCCL sync is 1.9% of the step." in text
    assert "| nccl/b.json | big | nccl | 100.0 | 200 | 3.00 | 30.0 | 0.200 (tol 0.1) | yes | exact | FAILED |" in text
    assert "with the same error, 0.200, after every method" in text
    assert "The check FAILED: see the table." in text  # c.json: the methods disagree


def test_a_server_sync_file_with_the_agreement_record_is_read_from_it(tmp_path):
    """Agreement present: it decides. Same output after NCCL as after the reload + a missed HF tolerance = the
    engines' forward gap; a disagreement = the sync is wrong, whatever the HF errors say."""
    agreed = _server_sync("big", (0.2, 0.2))
    agreed["agreement"] = [{"method": "nccl", "reference": "safetensors", "tokens_equal": True,
                            "max_logprob_diff": 0.0, "ok": True}]
    differs = _server_sync("big", (0.05, 0.05))
    differs["agreement"] = [{"method": "nccl", "reference": "safetensors", "tokens_equal": False,
                             "max_logprob_diff": 0.4, "ok": False}]
    write_json(tmp_path / "nccl" / "agreed.json", agreed)
    write_json(tmp_path / "nccl" / "differs.json", differs)
    text = write_docs(tmp_path, tmp_path / "docs" / "grpo.md").read_text()
    assert ("after nccl equals its output after the safetensors reload (same tokens, logprobs within 0.0e+00): "
            "nccl delivered the weights vLLM's own loader reads. The HF check's miss of its tolerance (0.1) is then "
            "the two engines' bf16 forwards, not the sync.") in text
    assert "After nccl the server's output DIFFERS from its output after the safetensors reload" in text
    assert "with the same error" not in text  # the heuristic is only for files without the record

