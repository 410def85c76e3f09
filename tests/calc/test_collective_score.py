"""calc/collective_score.py: each model scored only on points it was not fitted on, with hand-computed values;
and bench/calc_collectives_score.py on the committed 2-GPU sweep."""
from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.calc.collective_score import (Point, bucketed_all_reduce_s, regime, score_cross, score_loo,
                                            score_prior, summarize)
from scalelab.calc.collectives import Link
from tests.bench_script import load_bench

REPO = Path(__file__).resolve().parents[2]
ALPHA, BW = 20e-6, 200e9
SIZES = [2.0 ** k for k in range(3, 31, 3)]


def line(collective: str, size: float, n: int = 2) -> Point:
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n}[collective]
    return Point(collective, size, ALPHA + factor * size / BW)


def test_regimes_split_at_1_mib_and_32_mib():
    assert [regime(s) for s in (2 ** 20 - 1, 2 ** 20, 32 * 2 ** 20 - 1, 32 * 2 ** 20)] == \
        ["latency", "middle", "middle", "bandwidth"]


def test_prior_is_alpha_plus_factor_times_size_over_bus_bandwidth():
    (row,) = score_prior([Point("all_reduce", 1e9, 0.02)], 2, Link(100e9, 10e-6))
    assert row.predicted_s == pytest.approx(10e-6 + 1.0 * 1e9 / 100e9)
    assert row.rel_err == pytest.approx(0.01001 / 0.02 - 1)
    (row4,) = score_prior([Point("all_reduce", 1e9, 0.02)], 4, Link(100e9, 10e-6))
    assert row4.predicted_s == pytest.approx(10e-6 + 1.5 * 1e9 / 100e9)   # 2(n-1)/n at n = 4


def test_leave_one_out_never_sees_the_point_it_predicts():
    pts = [line("all_reduce", s) for s in SIZES]
    bent = Point("all_reduce", pts[4].size_bytes, pts[4].time_s * 1.5)     # one point off the line by +50%
    rows = score_loo(pts[:4] + [bent] + pts[5:], 2)
    assert rows[4].predicted_s == pytest.approx(pts[4].time_s, rel=1e-9)    # the line of the other points
    assert rows[4].rel_err == pytest.approx(1 / 1.5 - 1, rel=1e-9)
    assert "9 other sizes" in rows[4].fitted_on


def test_cross_predicts_a_collective_from_the_others_only():
    pts = [line("all_reduce", s) for s in SIZES] + [line("all_gather", s) for s in SIZES]
    rows = score_cross(pts, 2)
    gathers = [r for r in rows if r.collective == "all_gather"]
    assert len(gathers) == len(SIZES) and all(r.fitted_on == "all_reduce" for r in gathers)
    assert max(abs(r.rel_err) for r in rows) < 1e-9       # one bus bandwidth describes both, as built


def test_summary_counts_points_within_tolerance():
    rows = score_prior([Point("all_reduce", 8, 10e-6), Point("all_reduce", 8, 20e-6)], 2, Link(1e12, 11e-6))
    (lat, total) = [s for s in summarize(rows) if s.method == "prior"]
    assert (lat.regime, lat.n, lat.within_15pct) == ("latency", 2, 1)      # +10% inside, -45% outside
    assert total.worst_abs_err == pytest.approx(1 - (11e-6 + 8 / 1e12) / 20e-6)


def test_bucketed_all_reduce_counts_full_buckets_and_the_rest():
    link = Link(100e9, 10e-6)
    mib = 2 ** 20
    got = bucketed_all_reduce_s(60 * mib, 25 * mib, 2, link)
    assert got == pytest.approx(2 * (10e-6 + 25 * mib / 100e9) + (10e-6 + 10 * mib / 100e9))
    assert bucketed_all_reduce_s(50 * mib, 25 * mib, 2, link) == pytest.approx(2 * (10e-6 + 25 * mib / 100e9))


def test_committed_sweep_scored_every_point_by_every_model(tmp_path):
    if not (REPO / "results" / "h200" / "nccl_collectives.json").is_file():
        pytest.skip("committed NCCL sweep not present")
    bench = load_bench("calc_collectives_score")
    doc = bench.read_json(REPO / bench.NCCL)
    rows, summaries = bench.score(doc)
    assert len(rows) == 3 * len(doc["results"])
    assert {s.method for s in summaries} == {"prior", "loo", "cross"}
    bound = bench.ddp_bound(doc, bench.read_json(REPO / bench.CVM))
    # calc's own plan counts the same buckets before overlap (calc_vs_measured.json's ddp case)
    cvm = next(c for c in bench.read_json(REPO / bench.CVM)["cases"] if c["key"] == "ddp-s1")
    assert bound["all_reduce_total_s"] == pytest.approx(cvm["predicted_comm_before_overlap_s"], rel=1e-6)
    assert bound["residual_not_communication_s"] > 0.5 * bound["step_residual_s"]
