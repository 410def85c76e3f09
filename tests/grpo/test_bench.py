"""bench/grpo_rollout_bench.py in its CPU mode: the file it writes is what `grpo docs` reads."""
from __future__ import annotations

import json

import pytest

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
    assert not bench.partial_path(out).exists()   # the whole file written: the partial one is gone


def test_a_case_cut_after_its_baseline_keeps_the_baseline(tmp_path, monkeypatch):
    """A case stopped after HF's timing (here the update timing fails) leaves <out>.partial.json with HF's record."""
    bench = load_bench("grpo_rollout_bench")
    out = tmp_path / "rollout_bench.json"

    def cut(*args, **kwargs):
        raise KeyboardInterrupt  # what `timeout -s INT` delivers

    monkeypatch.setattr(bench, "time_update", cut)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--tiny", "--out", str(out)])
    assert not out.exists()
    kept = read_json(bench.partial_path(out))
    hf = kept["engines"]["hf"]
    assert "partial" in kept and 8 <= hf["completion_tokens"] <= 8 * 16 and hf["median_ms"] > 0
    assert kept["provenance"]["command"]


def test_profile_call_names_where_the_time_went(tmp_path):
    """The profile of a generate call whose time is one busy function: it leads the own-time table with most of the
    wall-clock, and the text file is written."""
    bench = load_bench("grpo_rollout_bench")

    def busy(n):  # a plain loop: its time is its own (with sum over a generator, the split between the two
        total = 0  # frames varies with the interpreter and the load)
        for i in range(n):
            total += i * i
        return total

    def generate(prompts, params):
        return [busy(300_000) for _ in prompts]

    out = bench.profile_call(generate, [[1], [2], [3]], None, str(tmp_path / "prof.txt"))
    top = out["top_tottime"]
    assert "busy" in top[0]["function"]
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
    (tmp_path / "d-cut.partial.json").write_text(json.dumps({"partial": "cut", "engines": {"hf": {}}}))  # no row
    (tmp_path / "provenance.json").write_text(json.dumps({"gpu": "H100", "runs": {}}))  # not a bench record: no row
    out = tmp_path / "t.md"
    assert table.main([str(tmp_path), "--out", str(out)]) == 0
    lines = {line.split(" | ")[0].lstrip("| "): line for line in out.read_text().splitlines()[2:]}
    assert sorted(lines) == ["a-colocated", "b-standalone", "c-other"]
    assert lines["a-colocated"].endswith("| 4.00x | 80% (1.20) |")
    assert lines["b-standalone"].endswith("| 6.00x | - |") and lines["c-other"].endswith("| 2.00x | - |")
    assert "300 / 480 (3.0%)" in lines["a-colocated"]


def test_vllm_engines_argument_reaches_the_config_and_the_record(tmp_path):
    """--vllm-engines K: rollout.server.engines of the colocated engine, recorded beside the options and in the
    provenance; K > 1 needs the subprocess engine core (the config's own check) and is the colocated engine's."""
    import pytest
    bench = load_bench("grpo_rollout_bench")
    args = bench.parse_args(["--engine-core", "subprocess", "--vllm-engines", "4", "--out", "x.json"])
    assert args.vllm_engines == 4 and bench.grpo_config(args, "vllm_colocated").rollout.server.engines == 4
    assert bench.parse_args(["--out", "x.json"]).vllm_engines == 1
    for bad in (["--vllm-engines", "2"], ["--vllm-engines", "0"],
                ["--engine-core", "subprocess", "--vllm-engines", "2", "--engines", "hf,vllm_standalone"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad + ["--out", "x.json"])
    out = tmp_path / "k.json"
    assert bench.main(["--tiny", "--no-sync", "--no-update", "--engine-core", "subprocess", "--vllm-engines", "2",
                       "--out", str(out)]) == 0
    r = read_json(out)
    assert r["vllm_engines"] == 2 and r["provenance"]["vllm_engines"] == 2
    assert r["vllm_options"]["requested"]["engine_core"] == "subprocess"


def test_lengths_mode_splits_one_request_per_sequence_over_the_engines(monkeypatch):
    """With lengths drawn per sequence the K engines get the requests of their slice of prompts (group-major, as
    their generate would) and the rows come back in order: 3 prompts x 2 samples over 2 engines."""
    import types
    from scalelab.grpo.engine_vllm_multi import MultiColocatedEngine, engine_shares
    from scalelab.grpo.types import RolloutBatch, SamplingParams
    bench = load_bench("grpo_rollout_bench")
    asked = []

    def fake_lengths(engine, requests, params):
        asked.append((engine.tag, [(r.prompt_ids, r.max_tokens, r.seed) for r in requests]))
        comps = tuple(tuple(range(r.max_tokens)) for r in requests)
        return RolloutBatch(tuple(r.prompt_ids for r in requests), comps, tuple("x" for _ in comps),
                            tuple(tuple(-1.0 for _ in c) for c in comps), tuple(False for _ in comps), 1.0, 0,
                            "vllm_colocated")

    subs = [types.SimpleNamespace(tag=k, weights_version=0) for k in range(2)]
    multi = MultiColocatedEngine(subs, engine_shares(0, 0.4, 2))
    monkeypatch.setattr(bench, "vllm_generate_lengths", fake_lengths)
    args = types.SimpleNamespace(length_spec=bench.LengthSpec("lognormal"))
    generate = bench.vllm_lengths_generate(multi, (1, 2, 3, 4, 5, 6), args)
    try:
        batch = generate([[7], [8], [9]], SamplingParams(n=2, seed=10))
    finally:
        multi.pool.shutdown()
    assert sorted(asked) == [(0, [((7,), 1, 10), ((7,), 2, 11), ((8,), 3, 10), ((8,), 4, 11)]),
                             (1, [((9,), 5, 10), ((9,), 6, 11)])]
    assert batch.lengths == (1, 2, 3, 4, 5, 6) and batch.prompt_ids == ((7,), (7,), (8,), (8,), (9,), (9,))


def test_rollout_table_shows_each_runs_engine_count(tmp_path):
    """K: the run's vllm_engines (runs recorded before the option: 1), '-' for an HF-only run."""
    table = load_bench("rollout_bench_table")
    base = {"model": {"name": "m"}, "ratio_vllm_over_hf": 2.0,
            "batch": {"prompts": 64, "group_size": 16, "sequences": 1024, "max_new_tokens": 256,
                      "temperature": 1.0, "top_p": 1.0},
            "answer_lengths": {"mean": 256.0, "p90": 256.0, "at_cap_frac": 1.0}}
    runs = {"k1-old": {**base, "engines": {"hf": {"tokens_per_s": 1000.0}, "vllm_colocated": {"tokens_per_s": 2e3}}},
            "k4": {**base, "vllm_engines": 4,
                   "engines": {"hf": {"tokens_per_s": 1000.0}, "vllm_colocated": {"tokens_per_s": 2e3}}},
            "hf-only": {**base, "ratio_vllm_over_hf": None, "engines": {"hf": {"tokens_per_s": 1000.0}}}}
    text = table.render(runs)
    assert "| run | vLLM engine | K | sequences |" in text
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()[2:]}
    assert lines["k4"].startswith("| k4 | vllm_colocated | 4 | 1,024 |")
    assert lines["k1-old"].startswith("| k1-old | vllm_colocated | 1 | 1,024 |")
    assert lines["hf-only"].startswith("| hf-only | - | - | 1,024 |")


def test_rollout_table_splits_traced_steps_of_a_finished_and_a_cut_case(tmp_path):
    """--trace-steps records: the finished run's last timed call and the cut case's call in flight, each engine's
    blocked / processing / outside shares of its span averaged over the engines, outputs/s summed."""
    table = load_bench("rollout_bench_table")

    def eng(steps, span, wait, process, outputs):
        return {"steps": steps, "span_s": span, "wait_s": wait, "process_s": process, "step_s": wait + process,
                "outside_s": span - wait - process, "mean_step_ms": 1e3 * (wait + process) / steps if steps else None,
                "outputs": outputs, "outputs_per_s": outputs / span if span else None}
    warm = {"elapsed_s": 9.0, "engines": [eng(1, 1.0, 0.5, 0.5, 1)]}
    timed = {"elapsed_s": 8.0, "engines": [eng(100, 10.0, 6.0, 3.0, 5000), eng(100, 10.0, 2.0, 7.0, 5000)]}
    base = {"model": {"name": "m"}, "ratio_vllm_over_hf": 2.0,
            "batch": {"prompts": 64, "group_size": 16, "sequences": 1024, "max_new_tokens": 256,
                      "temperature": 1.0, "top_p": 1.0},
            "answer_lengths": {"mean": 256.0, "p90": 256.0, "at_cap_frac": 1.0},
            "engines": {"hf": {"tokens_per_s": 1000.0}, "vllm_colocated": {"tokens_per_s": 2e3}},
            "vllm_engines": 2, "step_trace": {"engines": 2, "calls": [warm, warm, timed]}}
    (tmp_path / "k2.json").write_text(json.dumps(base))
    cut = {"partial": "cut", "engines": {"hf": {"tokens_per_s": 1000.0}},
           "step_trace": {"engines": 2, "calls": [], "in_flight": {
               "elapsed_s": 52.4, "engines": [eng(40, 50.0, 45.0, 4.0, 20480), eng(0, 0.0, 0.0, 0.0, 0)]}}}
    (tmp_path / "k4.partial.json").write_text(json.dumps(cut))
    (tmp_path / "hf.partial.json").write_text(json.dumps({"partial": "cut", "engines": {"hf": {}}}))  # untraced
    out = tmp_path / "t.md"
    assert table.main([str(tmp_path), "--out", str(out)]) == 0
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.read_text().split("\n\n")[1].splitlines()[2:]}
    assert sorted(rows) == ["k2", "k4 (cut)"]
    # k2: blocked (0.6 + 0.2) / 2 = 40%, processing (0.3 + 0.7) / 2 = 50%, outside 10%; 500 + 500 outputs/s
    assert rows["k2"] == "| k2 | timed 2 of 2 | 2 | 100 | 90.0 | 40% | 50% | 10% | 1,000 |"
    # the cut case: only the engine that had stepped; 45 / 50 blocked
    assert rows["k4 (cut)"] == "| k4 (cut) | cut after 52 s (0 done) | 2 | 40 | 1225.0 | 90% | 8% | 2% | 410 |"
