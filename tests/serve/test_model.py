"""The serving model: hand-computed step times, monotonic behaviour, calibration recovery, explanations."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from scalelab.calc.models import ModelSpec
from scalelab.calc.presets import get_model
from scalelab.calc.servemodel import decode_step_s, prefill_time_s
from scalelab.serve.fit import ENGINE_LIMITS, kv_capacity_tokens
from scalelab.serve.metrics import SLO, request_itl_s
from scalelab.serve.calibrate import default_fit_labels, fit_calibration
from scalelab.serve.explain import explain_scaling, slo_sentences, tp_ratio_sentences
from scalelab.serve.model import predict_row
from scalelab.serve.simulate import simulate_run
from scalelab.serve.steady import Dist, gap_distribution, inflight_grid, judged_gap_ok, lengths
from scalelab.serve.stepmodel import ServeCalibration, step_model
from scalelab.serve.client import RequestResult
from scalelab.serve.rows import Row, RowFigures, RowKey

TOY = ModelSpec("toy", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=100)
CAL = ServeCalibration(hbm_eff=0.8, prefill_eff=0.6, overhead_tp1_s=0.003, request_overhead_s=0.004)
H200_FLOPS, H200_HBM = 989.4e12, 4.8e12


def test_toy_batch1_row_by_hand():
    """Every prompt 1000 tokens, every output 10, TP=1: no all-reduce, no waiting at batch 1."""
    row = predict_row(TOY, "h200", RowKey("vllm", 1, 1), [1000] * 4, [10] * 4, SLO(), 0.9, 2.0, CAL)
    # 2N = 2 x (attention 24576 + MLP 49152 + head 6400) = 160256; a = 2 x 2 layers x 4 heads x (16 + 16) = 512
    prefill_flops = 160_256 * 1000 + 512 * 1000 * 1001 / 2                  # 416,512,000: compute-bound
    ttft = prefill_flops / (H200_FLOPS * 0.6) + 0.003 + 0.004                # + the request's own 4 ms
    # decode context (P*O + O(O-1)/2)/O = 1004.5; bytes 173696 + 1004.5 x 256 (memory-bound)
    itl = (173_696 + 1004.5 * 256) / (H200_HBM * 0.8) + 0.003
    f = row.figures
    assert row.status == "predicted"
    assert f.ttft_p50_ms == pytest.approx(ttft * 1e3) and f.ttft_p99_ms == pytest.approx(ttft * 1e3)
    assert f.itl_p50_ms == pytest.approx(itl * 1e3) and f.itl_p99_ms == pytest.approx(itl * 1e3)
    thr = 10 / (ttft + 9 * itl)
    assert f.throughput_tok_s == pytest.approx(thr)
    assert f.gpu_hours_per_1m == pytest.approx(1 / (thr * 3600) * 1e6)
    assert f.goodput_share == 1.0 and f.goodput_rps == pytest.approx(thr / 10)
    assert "decode memory-bound" in row.note and "all-reduce 0% of step" in row.note
    assert row.provenance["usd_per_1m_output"] == pytest.approx(2.0 * f.gpu_hours_per_1m)


def test_step_model_pure_cases_are_calc_servemodel():
    m = get_model("qwen2.5-7b")
    sm = step_model(m, "h200", 2, 0.9, CAL)
    assert sm.step_s(16, 700.0) == pytest.approx(decode_step_s(sm.setup, 16, 700.0) + CAL.step_overhead_s(2))
    prefill = sm.step_s(0, 0.0, 512, 512 * 513 / 2)
    assert prefill == pytest.approx(prefill_time_s(sm.setup, 512) + CAL.step_overhead_s(2))
    assert CAL.step_overhead_s(2) == pytest.approx(0.003 + 0.0005)


def test_inflight_wait_and_gap_distributions():
    two = Dist(np.array([3.0, 1.0]), np.array([0.5, 0.5]))
    assert inflight_grid(two, 4).tolist() == [1.0, 1.0, 3.0, 3.0]        # quantiles at 1/8, 3/8, 5/8, 7/8
    assert two.quantile(0.5) == 1.0 and two.quantile(0.51) == 3.0 and two.exceed(1.0) == 0.5
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    lens = lengths([100, 200], [50, 50])
    alone = gap_distribution(sm, 1, lens.context_mean, lens, 8192)
    assert len(alone.values) == 1 and alone.values[0] == pytest.approx(sm.step_s(1, lens.context_mean))
    big = step_model(get_model("qwen2.5-7b"), "h200", 1, 0.9, CAL)     # prompts of 1000+ tokens: compute-bound
    lens = lengths([1000, 2000], [50, 50])
    busy = gap_distribution(big, 26, lens.context_mean, lens, 8192)     # q = 25/50: 1 - e^-0.5 of steps prefill
    decode_only = big.step_s(26, lens.context_mean)
    assert busy.exceed(decode_only * (1 + 1e-9)) == pytest.approx(1 - math.exp(-0.5), abs=1e-4)  # tail cut at 1e-4
    assert busy.quantile(0.5) == pytest.approx(decode_only)


def _request(gaps: list[float]) -> RequestResult:
    return RequestResult(0, 0.0, 0.1, tuple(gaps), 1.0, len(gaps) + 1, 10, True)


def test_judged_gap_matches_the_metric_definition():
    # 3 gaps: the p99 ("higher") gap is the max: all 3 must pass, 0.9^3
    assert judged_gap_ok(np.array([3]), 0.1, 0.99)[0] == pytest.approx(0.729)
    # 201 gaps: rank ceil(0.99 x 200) = 198 (0-based), so 2 gaps may exceed the SLO and 3 may not
    p = 0.01
    expect = sum(math.comb(201, j) * p**j * (1 - p) ** (201 - j) for j in range(3))
    assert judged_gap_ok(np.array([201]), p, 0.99)[0] == pytest.approx(expect)
    assert request_itl_s(_request([0.01] * 199 + [0.5] * 2), 0.99) == 0.01
    assert request_itl_s(_request([0.01] * 198 + [0.5] * 3), 0.99) == 0.5
    assert judged_gap_ok(np.array([0]), 0.5, 0.99)[0] == 1.0


def test_batch_monotonic_until_the_kv_cap():
    m = get_model("qwen2.5-7b")
    prompts, outputs = [500] * 8, [100] * 8                                # context (500 x 100 + 4950)/100 = 549.5
    cap = int(kv_capacity_tokens(m, "h200", 1, 0.14, ENGINE_LIMITS["vllm"]) / 549.5)
    assert 8 < cap < 64
    rows = {b: predict_row(m, "h200", RowKey("vllm", 1, b), prompts, outputs, SLO(), 0.14, 3.0, CAL)
            for b in (1, 2, 4, 8, cap, 2 * cap, 4 * cap)}
    thr = [rows[b].figures.throughput_tok_s for b in (1, 2, 4, 8, cap)]
    assert all(a < b for a, b in zip(thr, thr[1:]))
    itl = [rows[b].figures.itl_p50_ms for b in (1, 2, 4, 8, cap)]
    assert all(a < b for a, b in zip(itl, itl[1:]))
    for b in (2 * cap, 4 * cap):           # beyond the cap: same running batch, the rest queue
        assert rows[b].figures.throughput_tok_s == pytest.approx(rows[cap].figures.throughput_tok_s)
        assert "queue" in rows[b].note
    assert rows[4 * cap].figures.ttft_p50_ms > rows[2 * cap].figures.ttft_p50_ms > rows[cap].figures.ttft_p50_ms


def test_wont_fit_row_and_intervals():
    m = get_model("qwen2.5-72b")
    lens = ([300, 900], [200, 300])
    no = predict_row(m, "h200", RowKey("vllm", 1, 16), *lens, SLO(), 0.9, 3.0)
    assert no.status == "wont_fit" and math.isnan(no.figures.throughput_tok_s) and "135.4 GiB" in no.note
    yes = predict_row(m, "h200", RowKey("vllm", 2, 16), *lens, SLO(), 0.9, 3.0)
    assert yes.status == "predicted"
    for name, band in yes.spread.items():
        assert band["lo"] <= getattr(yes.figures, name) <= band["hi"], name
    assert yes.spread["throughput_tok_s"]["lo"] < yes.figures.throughput_tok_s     # the corners move it
    assert "corners" in yes.provenance["interval"]


def _as_measured(rows: list[Row]) -> list[Row]:
    return [dataclasses.replace(r, status="ok") for r in rows]


def test_fit_calibration_recovers_known_constants():
    m = get_model("qwen2.5-7b")
    rng = np.random.default_rng(0)
    prompts, outputs = rng.integers(100, 1500, 16).tolist(), rng.integers(100, 400, 16).tolist()
    # a 15 ms request overhead against the 4 ms prior: the fit must move it, not prefill_eff, to meet the TTFTs
    true = ServeCalibration(hbm_eff=0.7, prefill_eff=0.45, overhead_tp1_s=0.0035, allreduce_latency_s=12e-6,
                            request_overhead_s=0.015)
    keys = [RowKey("vllm", tp, b) for tp in (1, 2) for b in (1, 16, 64)]
    measured = _as_measured([predict_row(m, "h200", k, prompts, outputs, SLO(), 0.9, 3.0, true) for k in keys])
    assert default_fit_labels(measured) == ("vllm TP=1 batch=1", "vllm TP=1 batch=64", "vllm TP=2 batch=1")
    tp2_only = [r for r in measured if r.key.tp == 2 and r.key.batch != 16]      # batch 1 and 64 at TP=2
    assert default_fit_labels(tp2_only) == ("vllm TP=2 batch=1",)               # one row stays held out
    cal = fit_calibration(measured, m, "h200", prompts, outputs)
    assert max(dict(cal.fit_rel_err).values()) < 0.01          # every figure of the fitted rows, within 1%
    # the weak pull to the priors (0.8, 0.6, 2 ms, 9 us) moves the constants the rows hardly tell apart: hbm_eff
    # against the step overhead (both set batch 1's step), and the all-reduce latency (56 calls, ~15% of a step)
    assert cal.hbm_eff == pytest.approx(0.7, rel=0.05) and cal.prefill_eff == pytest.approx(0.45, rel=0.02)
    assert cal.overhead_tp1_s == pytest.approx(0.0035, rel=0.05)
    assert cal.allreduce_latency_s == pytest.approx(12e-6, rel=0.15)
    assert cal.request_overhead_s == pytest.approx(0.015, rel=0.02)
    assert cal.fitted_on == default_fit_labels(measured)
    assert set(cal.fitted_params) == {"hbm_eff", "prefill_eff", "overhead_tp1_s", "request_overhead_s",
                                      "allreduce_latency_s"}
    held_out = predict_row(m, "h200", keys[4], prompts, outputs, SLO(), 0.9, 3.0, cal)
    assert held_out.figures.throughput_tok_s == pytest.approx(measured[4].figures.throughput_tok_s, rel=0.01)
    assert "fitted rows" in held_out.provenance["interval"]


def _row(tp: int, batch: int, thr: float, ttft99: float, itl50: float, itl99: float, status: str = "ok") -> Row:
    figs = RowFigures(thr, ttft99 / 2, ttft99, itl50, itl99, 1.0, 1.0, tp / (thr * 3600) * 1e6)
    return Row(RowKey("vllm", tp, batch), status, figs)


def test_scaling_sentences_from_numbers():
    rows = [_row(1, 16, 1000, 100, 10, 40), _row(2, 16, 1500, 80, 8, 30),
            _row(1, 64, 2000, 300, 20, 150), _row(2, 64, 3000, 2500, 15, 60),
            _row(1, 64, 2000, 300, 20, 150, status="predicted"), _row(2, 64, 2600, 900, 14, 50, status="predicted")]
    tp = tp_ratio_sentences(rows)
    assert any("At batch 16, TP=2 gives 1.50x" in s and "75% of linear" in s and "1.33x the GPU-hours" in s
               for s in tp)
    assert any("At batch 64, TP=2 gives 1.50x" in s and "(the model predicted 1.30x)" in s for s in tp)
    slo = slo_sentences(rows, SLO(ttft_s=2.0, itl_s=0.1))
    assert slo[0].startswith("vllm TP=1: p99 ITL breaks the 100 ms SLO first, at batch 64")
    assert "tail is steps that also carry" in slo[0]                       # median 20 ms is within the SLO
    assert slo[1].startswith("vllm TP=2: p99 TTFT breaks the 2.0 s SLO first, at batch 64")


def test_explain_scaling_uses_the_model_decomposition():
    m = get_model("qwen2.5-72b")
    prompts, outputs = [300, 900], [200, 300]
    rows = [predict_row(m, "h200", RowKey("vllm", tp, b), prompts, outputs, SLO(), 0.9, 3.0)
            for tp in (1, 2) for b in (1, 16)]
    text = explain_scaling(rows, m, "h200", prompts, outputs)
    assert text[0].startswith("vllm TP=1 does not fit at any batch")
    assert any(s.startswith("Model, batch-1 decode step of qwen2.5-72b") and "160 all-reduces" in s for s in text)
    assert any("TP=8" in s for s in text)                                   # TP ladder beyond the rows


def test_scalar_step_is_the_vector_step():
    sm = step_model(get_model("qwen2.5-72b"), "h200", 2, 0.9, CAL)
    assert sm.scalar_step_s(16, 16 * 700.0, 300, 300 * 301 / 2) == pytest.approx(
        float(sm.step_s(16, 700.0, 300, 300 * 301 / 2)))


def test_simulated_start_burst_and_chunks_by_hand():
    """2 clients, 2 prompts of 1000 tokens, 3 output tokens each, 1500 tokens per step (chunked prefill)."""
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    tr = simulate_run(sm, np.array([1000.0, 1000.0]), np.array([3.0, 3.0]), batch=2, max_running=8, budget=1500,
                      quantile=0.99)
    t0 = sm.scalar_step_s(0, 0.0, 1500, 1000 * 1001 / 2 + 500 * 501 / 2)     # all of prompt 0, half of prompt 1
    t1 = sm.scalar_step_s(1, 1001.0, 500, 500 * 500 + 500 * 501 / 2)        # request 0 decodes; rest of prompt 1
    t2 = sm.scalar_step_s(2, 1002.0 + 1001.0, 0, 0)                          # both decode
    t3 = sm.scalar_step_s(1, 1002.0, 0, 0)                                   # request 0 is done
    assert tr.step_s.tolist() == pytest.approx([t0, t1, t2, t3])
    assert tr.decoders.tolist() == [0, 1, 2, 1]
    assert tr.ttft_s.tolist() == pytest.approx([t0, t0 + t1])
    assert tr.judged_gap_s.tolist() == pytest.approx([max(t1, t2), max(t2, t3)])
    assert tr.duration_s == pytest.approx(t0 + t1 + t2 + t3) and tr.output_tokens == 6


def test_simulated_batch1_runs_match_the_steady_state():
    prompts, outputs = [1000, 400, 700, 1000], [10, 30, 20, 10]
    key = RowKey("vllm", 1, 1)
    steady = predict_row(TOY, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, CAL).figures
    runs = predict_row(TOY, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, CAL, requests_per_run=4)
    # one request at a time: TTFT = its prefill + overhead, decode steps memory-bound (linear in the context)
    assert runs.figures.throughput_tok_s == pytest.approx(steady.throughput_tok_s, rel=1e-4)
    assert runs.figures.ttft_p50_ms == pytest.approx(steady.ttft_p50_ms)
    assert "simulated runs of 4 requests" in runs.note


def test_a_single_wave_pays_its_burst_and_drain():
    m = get_model("qwen2.5-7b")
    rng = np.random.default_rng(1)
    prompts, outputs = rng.integers(100, 2000, 64).tolist(), rng.integers(100, 500, 64).tolist()
    key = RowKey("vllm", 1, 32)
    steady = predict_row(m, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, CAL).figures
    waves = predict_row(m, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, CAL, requests_per_run=32).figures
    assert waves.throughput_tok_s < 0.9 * steady.throughput_tok_s           # the drain runs at falling batch
    assert waves.ttft_p99_ms > 2 * steady.ttft_p99_ms                        # 32 prompts queue behind each other


def test_request_overhead_delays_each_arrival_and_adds_to_its_ttft():
    """1 client, 2 requests of 100-token prompts and 2 output tokens, 5 ms from send to the engine."""
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    r = 0.005
    tr = simulate_run(sm, np.array([100.0, 100.0]), np.array([2.0, 2.0]), batch=1, max_running=8, budget=8192,
                      quantile=0.99, request_overhead_s=r)
    pre = sm.scalar_step_s(0, 0.0, 100, 100 * 101 / 2)
    dec = sm.scalar_step_s(1, 101.0, 0, 0)
    assert tr.step_s.tolist() == pytest.approx([pre, dec, pre, dec])   # the engine idles while a request travels
    assert tr.ttft_s.tolist() == pytest.approx([r + pre, r + pre])
    assert tr.duration_s == pytest.approx(2 * (r + pre + dec))


def test_a_request_arriving_mid_step_waits_for_the_next():
    """2 clients: request 2 is sent when request 0 finishes; it reaches the engine 1 us later, during the step
    already launched (request 1's decode), and its prompt goes into the step after."""
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    tr = simulate_run(sm, np.array([100.0, 100.0, 100.0]), np.array([2.0, 4.0, 2.0]), batch=2, max_running=8,
                      budget=8192, quantile=0.99, request_overhead_s=1e-6)
    # both prompts; both decode (request 0 ends); request 1 alone; request 1 + prompt 2; request 2 alone
    assert tr.decoders.tolist() == [0, 2, 1, 1, 1]
    t = np.cumsum(tr.step_s)
    assert tr.ttft_s[2] == pytest.approx(t[3] - t[1])    # sent at the end of step 1, first token at the end of 3


def test_a_prefill_step_of_its_own_pauses_every_decoder_by_hand():
    """SGLang's default scheduler (mixed=False): request 1's 1000-token prompt arrives while request 0 (100 tokens,
    3 out) decodes; its prefill runs alone, request 0's next gap spans it, request 1's first gap does not."""
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    prompts, outputs = np.array([100.0, 1000.0]), np.array([3.0, 2.0])
    a = sm.scalar_step_s(0, 0.0, 100, 100 * 101 / 2)                    # request 0's prompt
    b = sm.scalar_step_s(1, 101.0, 0, 0)                                 # request 0 decodes; request 1 arrives
    p = sm.scalar_step_s(0, 0.0, 1000, 1000 * 1001 / 2)                  # request 1's prompt, alone
    c = sm.scalar_step_s(2, 102.0 + 1001.0, 0, 0)                        # both decode, both end
    sends = np.array([0.0, a + 1e-4])
    tr = simulate_run(sm, prompts, outputs, 0, 8, 8192, 0.99, send_times=sends, mixed=False)
    assert tr.step_s.tolist() == pytest.approx([a, b, p + c])           # decode steps carry the pause before them
    assert tr.decoders.tolist() == [0, 1, 2]
    assert tr.ttft_s.tolist() == pytest.approx([a, a + b + p - sends[1]])
    assert tr.judged_gap_s.tolist() == pytest.approx([p + c, c])
    assert tr.duration_s == pytest.approx(a + b + p + c)
    mixed = simulate_run(sm, prompts, outputs, 0, 8, 8192, 0.99, send_times=sends)
    m = sm.scalar_step_s(1, 102.0, 1000, 1000 * 1001 / 2)               # the prompt joins request 0's decode
    assert mixed.step_s.tolist()[:3] == pytest.approx([a, b, m])
    assert mixed.judged_gap_s[0] == pytest.approx(max(b, m))


# ---------------------------------------------------------------------------------------------
# open loop: requests sent at given times


def test_an_open_loop_request_waits_only_for_the_engine_not_for_a_client():
    """Two 100-token prompts with 2 output tokens: the second sent 1 s after the first (the engine long idle
    again) is served alone; sent at the same instant as the first, both share the prefill step, exactly as a
    closed loop of 2 clients sends them."""
    sm = step_model(TOY, "h200", 1, 0.9, CAL)
    prompts, outputs = np.array([100.0, 100.0]), np.array([2.0, 2.0])
    r = 0.004
    spaced = simulate_run(sm, prompts, outputs, 0, 8, 8192, 0.99, r, send_times=np.array([5.0, 6.0]))
    pre, dec = sm.scalar_step_s(0, 0.0, 100, 100 * 101 / 2), sm.scalar_step_s(1, 101.0, 0, 0)
    assert spaced.step_s.tolist() == pytest.approx([pre, dec, pre, dec])
    assert spaced.ttft_s.tolist() == pytest.approx([r + pre, r + pre])     # each TTFT from its own send
    assert spaced.duration_s == pytest.approx(6.0 + r + pre + dec)        # from the run start, not the first send
    at_once = simulate_run(sm, prompts, outputs, 0, 8, 8192, 0.99, r, send_times=np.zeros(2))
    closed = simulate_run(sm, prompts, outputs, 2, 8, 8192, 0.99, r)
    assert at_once.step_s.tolist() == pytest.approx(closed.step_s.tolist())
    assert at_once.ttft_s.tolist() == pytest.approx(closed.ttft_s.tolist())


def test_predicted_open_loop_rows_fall_past_the_engines_capacity():
    """The 7B on one H200, 60 ShareGPT-like requests per repeat at Poisson send times: every request meets the
    SLO at 1 req/s; at 1000 req/s (all 60 at once, in effect) prompts queue behind each other and their chunks,
    merged into the decode steps, stretch the gaps: TTFT rises and the goodput share falls below 90%."""
    from scalelab.serve.model import predict_open_row
    from scalelab.serve.workload import arrival_times
    m = get_model("qwen2.5-7b")
    rng = np.random.default_rng(0)
    prompts, outputs = rng.integers(100, 2000, 120).tolist(), rng.integers(100, 500, 120).tolist()
    rows = {}
    for rate in (1.0, 1000.0):
        times = [arrival_times(60, rate, seed) for seed in (1, 2)]
        rows[rate] = predict_open_row(m, "h200", RowKey("vllm", 1, 0), prompts, outputs, times, SLO(), 0.9, 3.5, CAL)
    light, flood = rows[1.0].figures, rows[1000.0].figures
    assert rows[1.0].status == "predicted" and "2 simulated repeats of 60 requests" in rows[1.0].note
    assert light.goodput_share == 1.0 and flood.goodput_share < 0.9
    assert flood.ttft_p99_ms > 10 * light.ttft_p99_ms and flood.itl_p99_ms > 10 * light.itl_p99_ms
    assert flood.throughput_tok_s > 5 * light.throughput_tok_s             # a full batch against a trickle
    with pytest.raises(ValueError, match="120 requests for 60 send times"):
        predict_open_row(m, "h200", RowKey("vllm", 1, 0), prompts, outputs, [np.zeros(60)], SLO(), 0.9, 3.5, CAL)


def test_sglangs_default_scheduler_predicts_longer_gaps_than_mixed_chunks():
    """The same Poisson load through the limits each launch sets: SGLang as shipped (a prefill step alone) stalls
    every stream for each arriving prompt and each chunk of it, so its p99 gap exceeds the mixed scheduler's and
    requests miss the SLO that the mixed one keeps; at a trickle, where prompts seldom meet a running decode, the
    two agree on TTFT."""
    from scalelab.serve.fit import limits_for
    from scalelab.serve.model import predict_open_row
    from scalelab.serve.workload import arrival_times
    m = get_model("qwen2.5-7b")
    rng = np.random.default_rng(0)
    prompts, outputs = rng.integers(100, 2000, 240).tolist(), rng.integers(100, 500, 240).tolist()
    shipped, mixed = limits_for("sglang", {"max-running-requests": 256}), \
        limits_for("sglang", {"max-running-requests": 256, "enable-mixed-chunk": True})
    assert not shipped.mixed_prefill and mixed.mixed_prefill and shipped.max_num_seqs == mixed.max_num_seqs == 256
    key = RowKey("sglang", 1, 0)
    busy = [arrival_times(120, 12.0, seed) for seed in (1, 2)]
    alone = predict_open_row(m, "h200", key, prompts, outputs, busy, SLO(), 0.9, 3.5, CAL, limits=shipped).figures
    joint = predict_open_row(m, "h200", key, prompts, outputs, busy, SLO(), 0.9, 3.5, CAL, limits=mixed).figures
    assert alone.itl_p99_ms > 1.3 * joint.itl_p99_ms
    assert joint.goodput_share > 0.95 and alone.goodput_share < 0.9
    assert alone.itl_p50_ms == pytest.approx(joint.itl_p50_ms, rel=0.1)     # most steps decode alone in both
    trickle = [arrival_times(2, 0.01, seed) for seed in range(120)]
    quiet_alone = predict_open_row(m, "h200", key, prompts, outputs, trickle, SLO(), 0.9, 3.5, CAL, limits=shipped)
    quiet_joint = predict_open_row(m, "h200", key, prompts, outputs, trickle, SLO(), 0.9, 3.5, CAL, limits=mixed)
    assert quiet_alone.figures.ttft_p50_ms == pytest.approx(quiet_joint.figures.ttft_p50_ms, rel=0.02)
