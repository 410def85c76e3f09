"""Open-loop scoring: the knee and the interpolated crossing by hand, predictions matched by rate and arrival CV."""
from __future__ import annotations

import dataclasses

import pytest

from scalelab.serve.openloop import knee_of, knee_scores, open_loop_md, rate_points
from scalelab.serve.rows import Row, RowFigures, RowKey


def _row(rate: float, share: float, status: str = "ok", cv: float = 1.0) -> Row:
    figures = dataclasses.replace(RowFigures.nan(), goodput_share=share, ttft_p99_ms=100.0, itl_p99_ms=50.0,
                                  throughput_tok_s=1000.0 * rate)
    return Row(RowKey("vllm", 1, 0), status, figures,
               provenance={"load": {"mode": "rate", "rate_rps": rate, "cv": cv}})


def test_knee_and_crossing_by_hand():
    k = knee_of([(40.0, 0.81), (6.0, 1.0), (34.0, 0.95), (48.0, 0.81)], 0.90)
    assert k.knee_rps == 40.0 and k.top_rps == 48.0
    assert k.crossing_rps == pytest.approx(34 + 6 * 0.05 / 0.14)   # between 34 (95%) and 40 (81%)
    assert (k.meets_rps, k.knee_rps) == (34.0, 40.0)                  # the rungs the crossing lies between
    assert knee_of([(8.0, 1.0), (95.0, 0.95)], 0.9).knee_rps is None
    first = knee_of([(10.0, 0.5), (20.0, 0.2)], 0.9)
    assert first.knee_rps == first.crossing_rps == 10.0


def test_points_match_rate_and_cv_and_the_knee_is_scored():
    measured = [_row(26, 1.0), _row(34, 0.95), _row(40, 0.81), _row(40, 0.89, cv=1.414214), _row(48, 0.0, "failed")]
    predicted = [_row(26, 1.0, "predicted"), _row(34, 0.86, "predicted"), _row(40, 0.50, "predicted"),
                 _row(40, 0.30, "predicted", cv=1.414214), _row(48, 0.15, "predicted")]
    points = rate_points(measured, predicted)
    assert [(p.rate_rps, p.cv) for p in points] == [(26, 1.0), (34, 1.0), (40, 1.0), (40, 1.414214)]
    gamma = points[-1]
    assert (gamma.predicted.goodput_share, gamma.measured.goodput_share) == (0.30, 0.89)
    (score,) = knee_scores(points, 0.9)
    assert (score.predicted.knee_rps, score.measured.knee_rps) == (34, 40)
    assert score.ratio == pytest.approx(0.85) and score.within
    text = "\n".join(open_loop_md(points, 0.9))
    assert "knee predicted 34 req/s, measured 40 req/s (ratio 0.85, within ±20%)" in text
    assert "measured (interpolated between the rungs at 34 and 40 req/s)" in text
    assert "| vllm TP=1 | gamma CV=1.41 λ=40 req/s | 30% / 89% |" in text


def test_no_measured_knee_is_not_scored():
    points = rate_points([_row(8, 1.0), _row(95, 1.0)], [_row(8, 1.0, "predicted"), _row(95, 0.5, "predicted")])
    (score,) = knee_scores(points, 0.9)
    assert score.ratio is None and score.within is None
    assert "predicted knee 95 req/s: not reached, so not scored" in "\n".join(open_loop_md(points, 0.9))


def test_misses_are_counted_by_reason_from_full_or_slim_records(tmp_path):
    import json

    from scalelab.serve.openloop import row_misses
    full = [{"ttft_s": 0.1, "itl_s": [0.01] * 50, "success": True},             # good
            {"ttft_s": 2.5, "itl_s": [0.01] * 50, "success": True},             # TTFT only
            {"ttft_s": 0.1, "itl_s": [0.01] * 49 + [0.2], "success": True},     # <= 100 gaps: judged = max
            {"ttft_s": 0.1, "itl_s": [0.01] * 148 + [0.2, 0.3], "success": True},  # 150 gaps: judged 0.2
            {"ttft_s": 0.1, "itl_s": [0.01] * 149 + [0.3], "success": True},    # 150 gaps: judged 0.01, good
            {"ttft_s": 0.0, "itl_s": [], "success": False},                     # failed
            {"ttft_s": 9.0, "itl_s": [], "success": True, "warmup": True}]      # excluded
    slim = [{"ttft_s": 3.0, "gap_judged_s": 0.5, "success": True}]              # both
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests-slim").mkdir()
    (tmp_path / "requests" / "vllm-tp1-r40-r0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in full))
    (tmp_path / "requests-slim" / "vllm-tp1-r40-r1.jsonl").write_text(json.dumps(slim[0]) + "\n")
    row = dataclasses.replace(_row(40, 0.5), provenance={"load": {"mode": "rate", "rate_rps": 40.0, "cv": 1.0},
                                                         "request_files": "requests/vllm-tp1-r40-*.jsonl"})
    m = row_misses(tmp_path, row, 2.0, 0.100)
    assert (m.requests, m.ttft_only, m.gap_only, m.both, m.failed) == (7, 1, 2, 1, 1)
    assert row_misses(tmp_path / "none", row, 2.0, 0.1) is None


def test_search_json_reads_back_as_written_and_prints_as_the_cli_does(tmp_path):
    from scalelab.core.jsonio import write_json
    from scalelab.serve.metrics import SLO, Probe, RateSearch
    from scalelab.serve.openloop import read_search, search_sentence
    from scalelab.serve.sweep import search_record

    found = RateSearch(36.87817782917155, 0.9574468085106382,
                       (Probe(34.0, (0.98, 0.99), True), Probe(40.0, (0.99, 0.40), False),
                        Probe(36.87817782917155, (1.0, 0.915), True)))
    write_json(tmp_path / "search.json", search_record(found, "vllm", 1, 2, SLO(2.0, 0.1)))
    assert read_search(tmp_path) == found
    assert read_search(tmp_path / "none") is None
    assert search_sentence(found) == (
        "highest rate meeting the SLO: 36.9 req/s (median share 96%)\n"
        "probes (each repeat's goodput share): 34/s -> 98%/99% (meets), 40/s -> 99%/40% (misses), "
        "36.9/s -> 100%/92% (meets)")


def test_a_search_whose_bottom_missed_says_it_found_no_rate():
    from scalelab.serve.metrics import Probe, RateSearch
    from scalelab.serve.openloop import search_sentence
    missed = RateSearch(0.0, 0.795, (Probe(95.0, (0.62, 0.97), False),))
    assert search_sentence(missed) == (
        "no probed rate met the SLO (the lowest, 95 req/s: median share 80%); the highest rate meeting it lies "
        "below that\nprobes (each repeat's goodput share): 95/s -> 62%/97% (misses)")
