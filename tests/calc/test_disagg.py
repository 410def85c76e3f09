"""Serving model: queueing formulas, length distributions, step times, goodput, and the crossover's direction."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from scalelab.calc.cluster import make_cluster
from scalelab.calc.crossover import ScanPoint, boundaries, labels, prompt_scan, regions, tpot_scan, verdict
from scalelab.calc.disagg import analyze, auto_tp
from scalelab.calc.goodput import (Capacities, InstanceState, decode_batch, fluid_per_gpu, gpus_at_rate,
                                   ratio_rows, workload_stats)
from scalelab.calc.presets import get_model
from scalelab.calc.queueing import mg1_wait_s, priority_wait_s, wait_quantile_s
from scalelab.calc.servemodel import (MeasuredRates, ServeSetup, decode_step_s, kv_transfer_s, load_measured,
                                      prefill_time_s)
from scalelab.calc.workload import LengthDist, get_workload

LLAMA70 = get_model("llama-3.1-70b")


def serve(tp: int = 4, **kw) -> ServeSetup:
    return ServeSetup(LLAMA70, make_cluster("h100-sxm", 8, calibrate=False), tp, **kw)


# ---------------------------------------------------------------------------------------------
# queueing (Kleinrock vol. 1 eq. 5.105; Cobham 1954)


def test_pollaczek_khinchine():
    assert mg1_wait_s(0.5, 1.0, 1.0) == pytest.approx(0.5)       # M/D/1: rho/(2(1-rho)) = 0.5
    assert mg1_wait_s(0.5, 1.0, 2.0) == pytest.approx(1.0)       # M/M/1: rho/(mu-lambda) = 1
    assert math.isinf(mg1_wait_s(1.0, 1.0, 1.0))


def test_priority_queue_reduces_to_pk_and_adds_residual():
    assert priority_wait_s(0.5, 1.0, 1.0, 0.0) == mg1_wait_s(0.5, 1.0, 1.0)
    # R = 0.25 + 0.1 over 1 - rho = 0.5 -> 0.7
    assert priority_wait_s(0.5, 1.0, 1.0, 0.1) == pytest.approx(0.7)


def test_wait_quantile_exponential_tail():
    assert wait_quantile_s(1.0, 1.0) == pytest.approx(math.log(10))
    assert wait_quantile_s(1.0, 0.05) == 0.0                      # fewer than 10% wait at all


# ---------------------------------------------------------------------------------------------
# workload and step times


def test_length_distributions():
    assert LengthDist("fixed", 8192).moment(2) == 8192 ** 2
    ln = LengthDist("lognormal", 250, 1.0)
    assert ln.moment() == pytest.approx(250, rel=0.03)            # mid-quantile grid misses a sliver of tail
    assert ln.quantile(0.5) == pytest.approx(250 * math.exp(-0.5), rel=0.02)   # median = mean·e^(-s²/2)
    assert LengthDist("uniform", 100, 0.5).moment() == pytest.approx(100)


def test_prefill_and_decode_roofline():
    ss = serve()
    # decode at batch 1, context 0: reads 141.1 GB of bf16 weights over 4 x 3.35 TB/s x 0.8 + 160 small all-reduces
    weights = 70_553_706_496 * 2 / (4 * 3.35e12 * 0.8)
    ar = 10e-6 + 2 * 3 / 4 * 8192 * 2 / 450e9
    assert decode_step_s(ss, 1, 0) == pytest.approx(weights + 160 * ar)
    # each extra sequence adds its KV read: 1000 tokens x 327,680 B
    assert decode_step_s(ss, 2, 1000) - decode_step_s(ss, 1, 1000) == pytest.approx(
        1000 * 327_680 / (4 * 3.35e12 * 0.8) + 160 * 2 * 3 / 4 * 8192 * 2 / 450e9)
    assert prefill_time_s(ss, 8192) > prefill_time_s(ss, 4096) * 2     # attention grows quadratically


def test_kv_transfer_cost():
    # 8192 tokens x 327,680 B = 2.68 GB; 4 GPUs each send their shard over a 50 GB/s NIC: 13.4 ms + 20 µs
    assert kv_transfer_s(serve(), 8192, "inter") == pytest.approx(8192 * 327_680 / 200e9 + 20e-6)
    assert kv_transfer_s(serve(), 8192, "intra") < kv_transfer_s(serve(), 8192, "inter") / 5


def test_measured_rates_override(tmp_path):
    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"prefill_tokens_per_s": 10000, "decode_step_s": {"1": 0.02, "65": 0.036}}))
    ss = serve(measured=load_measured(path))
    assert prefill_time_s(ss, 5000) == pytest.approx(0.5)
    assert decode_step_s(ss, 33, 123) == pytest.approx(0.028)       # linear between the measured points
    assert decode_step_s(ss, 129, 123) == pytest.approx(0.052)      # and beyond
    assert not ss.measured.empty and MeasuredRates().empty


def test_auto_tp_leaves_room_for_kv():
    assert auto_tp(70_553_706_496 * 2, 80e9) == 4
    assert auto_tp(8_030_261_248 * 2, 80e9) == 1


# ---------------------------------------------------------------------------------------------
# goodput


def test_decode_batch_fixed_point_matches_closed_form():
    # t(B) = a + bB: B = lambda E[O] a / (1 - lambda E[O] b)
    a, b, lam, out = 0.02, 0.0001, 10.0, 200.0
    got = decode_batch(lambda x: a + b * x, lam, out, 1.0, 10_000)
    assert got == pytest.approx(lam * out * a / (1 - lam * out * b), rel=1e-6)
    assert math.isinf(decode_batch(lambda x: a + b * x, 60.0, out, 1.0, 10_000))   # lambda E[O] b > 1


def test_ratio_rows_and_fluid_limit():
    st = InstanceState(0, 0, 0, 0, True)
    cap = Capacities(2.0, 1.0, 3.0, st, st, st)
    rows = {(r.prefill_instances, r.decode_instances): r for r in ratio_rows(cap, tp=4)}
    assert rows[(3, 1)].goodput_rps == 3.0 and rows[(3, 1)].limited_by == "prefill"
    assert rows[(3, 1)].goodput_per_gpu == pytest.approx(3.0 / 16)
    assert fluid_per_gpu(cap, 4) == pytest.approx(1 / (4 * (1 / 1 + 1 / 3)))
    at = gpus_at_rate(cap, 4, 5.0)
    assert (at.colocated_gpus, at.prefill_instances, at.decode_instances, at.disagg_gpus) == (12, 5, 2, 28)


def test_slo_met_at_capacity():
    w = get_workload("long-prompt")
    r = analyze(serve(), w, scans=False)
    c = r.capacities
    assert c.prefill.ttft_p90_s == pytest.approx(w.ttft_slo_s, rel=1e-3)
    assert c.colocated.ok and c.prefill.ok and c.decode.ok
    assert r.stats.max_batch == pytest.approx((4 * 80e9 * 0.9 - 70_553_706_496 * 2) / (8320 * 327_680))


def test_disaggregation_gains_with_prompt_length():
    # longer prompts -> prefill stalls eat more of a colocated instance's decode time (DistServe sec. 2.2)
    w = get_workload("long-prompt")
    short, long_ = prompt_scan(serve(), w, "inter", [64, 1024])
    assert long_.advantage > short.advantage
    assert verdict(short.advantage) == "wash" and verdict(long_.advantage) == "pays"


def test_disaggregation_gains_with_tighter_tpot():
    w = get_workload("sharegpt")
    pts = tpot_scan(serve(), w, "inter", [0.02, 0.05, 0.1])
    advs = [p.advantage for p in pts]
    assert advs == sorted(advs, reverse=True) and advs[0] > 2


def test_regions_group_consecutive_verdicts():
    w = get_workload("sharegpt")
    pts = prompt_scan(serve(), w, "inter", [64, 90, 700, 1000])
    rs = regions(pts)
    assert [r.verdict for r in rs] == ["wash", "pays"] and rs[1].lo == pytest.approx(pts[2].knob)


def test_workload_stats_context():
    st = workload_stats(serve(), get_workload("long-prompt"), "inter")
    assert st.context_mean == 8192 + 256 / 2                      # E[P] + E[O²]/(2E[O]) for fixed lengths
    assert st.prefill_mean_s == pytest.approx(st.prefill_p90_s)


def test_scaled_distribution_keeps_shape():
    d = LengthDist("lognormal", 250, 1.0, 4, 4096).scaled(4)
    assert (d.mean, d.lo, d.hi, d.sigma) == (1000, 16, 16384, 1.0)
    assert dataclasses.replace(d, kind="fixed").moment() == 1000


def test_labels_and_boundaries():
    pts = [ScanPoint(100, 10.0, 10.2, 1), ScanPoint(200, 8.0, 9.6, 2), ScanPoint(400, 4.0, 3.0, 3),
           ScanPoint(800, 0.1, 0.4, 4, prefill_p90_share=0.8), ScanPoint(1600, 0.0, 0.0, 5, prefill_p90_share=1.2)]
    assert labels(pts) == ["wash", "pays", "loses", "SLO-limited", "SLO infeasible"]
    b = boundaries(pts)
    # advantage 1.02 -> 1.20 crosses 1.05 a sixth of the way (in log knob) from 100 to 200
    assert (b[0].before, b[0].after) == ("wash", "pays")
    assert b[0].knob == pytest.approx(100 * 2 ** (0.03 / 0.18))
