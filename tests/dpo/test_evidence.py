"""Evidence bar: length statistics, paired tests and pass/fail cells against hand-computed values."""
from __future__ import annotations

import math

import pytest

from scalelab.dpo.evidence import (FAIL, NOT_MEASURED, PASS, CriterionResult, EvidenceBar, LengthStats,
                                   PairedDifference, RunMetrics, compare_paired_binary, length_ratio,
                                   length_stats, mcnemar_exact_p, paired_bootstrap, paired_length_ratios,
                                   render_evidence_table, verdict, verdict_text, wilson_interval)

# ---------------------------------------------------------------------------------------------
# lengths


def test_length_stats_by_hand():
    # sorted [10, 20, 30, 40, 64]; mean 164/5; p90 at position 0.9*4 = 3.6: 40 + 0.6*(64-40) = 54.4
    s = length_stats([40, 10, 64, 30, 20], max_new_tokens=64)
    assert s.n == 5
    assert s.mean_tokens == pytest.approx(32.8)
    assert s.median_tokens == 30.0
    assert s.p90_tokens == pytest.approx(54.4)
    assert s.hit_limit_share == pytest.approx(0.2)


def test_length_stats_even_count_median_and_limit():
    s = length_stats([8, 8, 2, 4], max_new_tokens=8)
    assert s.median_tokens == 6.0                       # (4 + 8) / 2
    assert s.p90_tokens == pytest.approx(8.0)           # position 2.7 lies between two 8s
    assert s.hit_limit_share == 0.5


@pytest.mark.parametrize("counts,limit", [([], 8), ([3, -1], 8), ([3], 0)])
def test_length_stats_rejects_bad_input(counts, limit):
    with pytest.raises(ValueError):
        length_stats(counts, limit)


def test_length_ratio_is_mean_after_over_mean_before():
    before, after = length_stats([90, 110], 256), length_stats([120, 140], 256)
    assert length_ratio(before, after) == pytest.approx(1.3)


def test_paired_length_ratios_by_hand():
    # ratios [2, 1, 0.5]: mean 7/6, median 1, geometric mean (2 * 1 * 0.5) ** (1/3) = 1, one of three longer
    s = paired_length_ratios([10, 20, 40], [20, 20, 20])
    assert s.n == 3
    assert s.mean_ratio == pytest.approx(7 / 6)
    assert s.median_ratio == 1.0
    assert s.geometric_mean_ratio == pytest.approx(1.0)
    assert s.share_longer == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        paired_length_ratios([10, 0], [5, 5])
    with pytest.raises(ValueError):
        paired_length_ratios([10, 20], [5])

# ---------------------------------------------------------------------------------------------
# paired comparisons


def test_mcnemar_exact_by_hand():
    # b=8, c=2: 2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 2 * 56 / 1024
    assert mcnemar_exact_p(8, 2) == 0.109375
    assert mcnemar_exact_p(2, 8) == 0.109375
    assert mcnemar_exact_p(10, 0) == 2 / 1024
    assert mcnemar_exact_p(5, 5) == 1.0                 # 2 * P[X <= 5] > 1, capped
    assert mcnemar_exact_p(0, 0) == 1.0


def _binary_example():
    """20 examples: 8 only tuned right (b), 2 only base right (c), 5 both right, 5 neither."""
    base = [0] * 8 + [1] * 2 + [1] * 5 + [0] * 5
    tuned = [1] * 8 + [0] * 2 + [1] * 5 + [0] * 5
    return base, tuned


def test_compare_paired_binary_counts_and_tests():
    base, tuned = _binary_example()
    r = compare_paired_binary(base, tuned, n_resamples=2000, seed=7)
    assert (r.tuned_only, r.base_only, r.both_correct, r.neither_correct) == (8, 2, 5, 5)
    assert r.diff.base_mean == pytest.approx(0.35) and r.diff.tuned_mean == pytest.approx(0.65)
    assert r.diff.difference == pytest.approx(0.30)
    assert r.mcnemar_p == 0.109375
    assert r.diff.ci_low <= r.diff.difference <= r.diff.ci_high
    assert -1.0 <= r.diff.ci_low < r.diff.ci_high <= 1.0


def test_bootstrap_reproducible_with_seed():
    base, tuned = _binary_example()
    a = compare_paired_binary(base, tuned, n_resamples=2000, seed=3)
    b = compare_paired_binary(base, tuned, n_resamples=2000, seed=3)
    c = compare_paired_binary(base, tuned, n_resamples=2000, seed=4)
    assert a == b
    assert a.diff.seed == 3 and c.diff.seed == 4
    assert (a.diff.ci_low, a.diff.ci_high) != (c.diff.ci_low, c.diff.ci_high)


def test_paired_bootstrap_continuous():
    # a constant per-example shift leaves nothing to resample: the interval collapses onto it
    d = paired_bootstrap([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], n_resamples=500)
    assert d.difference == pytest.approx(0.5)
    assert d.ci_low == pytest.approx(0.5) and d.ci_high == pytest.approx(0.5)
    noisy = paired_bootstrap([0.1, 0.4, 0.2, 0.9, 0.5], [0.3, 0.4, 0.6, 0.8, 0.9], n_resamples=1000, seed=1)
    assert noisy.difference == pytest.approx(0.18)
    assert noisy.ci_low <= 0.18 <= noisy.ci_high
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        compare_paired_binary([0, 2], [1, 1])

# ---------------------------------------------------------------------------------------------
# the evidence bar


def _target(ci_low: float) -> PairedDifference:
    return PairedDifference(n=100, base_mean=0.40, tuned_mean=0.46, difference=0.06, ci_low=ci_low,
                            ci_high=0.11)


def _lengths(mean_after: float) -> tuple[LengthStats, LengthStats]:
    return (LengthStats(50, 100.0, 98.0, 150.0, 0.0), LengthStats(50, mean_after, 120.0, 190.0, 0.04))


def _metrics(ci_low=0.01, mmlu_tuned=44.0, mean_after=120.0, **kw) -> RunMetrics:
    before, after = _lengths(mean_after)
    return RunMetrics(target=_target(ci_low), mmlu_base_points=45.0, mmlu_tuned_points=mmlu_tuned,
                      length_before=before, length_after=after, **kw)


def _by_name(results: list[CriterionResult]) -> dict[str, CriterionResult]:
    return {r.name: r for r in results}


def test_bar_names_and_all_pass():
    res = EvidenceBar().evaluate(_metrics())
    assert [r.name for r in res] == ["target improved (CI low > 0)", "MMLU drop <= 2 pts", "length ratio <= 1.3x"]
    assert [r.status for r in res] == [PASS, PASS, PASS]
    assert verdict(res) == PASS


@pytest.mark.parametrize("ci_low,status", [(0.0, FAIL), (-0.01, FAIL), (0.001, PASS)])
def test_target_needs_ci_strictly_above_zero(ci_low, status):
    r = _by_name(EvidenceBar().evaluate(_metrics(ci_low=ci_low)))["target improved (CI low > 0)"]
    assert r.status == status and r.value == ci_low and r.threshold == 0.0


@pytest.mark.parametrize("tuned,status", [(43.0, PASS), (42.99, FAIL), (46.0, PASS)])
def test_mmlu_drop_edge(tuned, status):
    r = _by_name(EvidenceBar().evaluate(_metrics(mmlu_tuned=tuned)))["MMLU drop <= 2 pts"]
    assert r.status == status
    assert r.value == pytest.approx(45.0 - tuned)


def test_mmlu_edge_survives_float_rounding():
    # in binary floats 64.1 - 62.1 = 1.99999..., 64.4 - 62.4 = 2.000000000000007: both a 2.0-point drop
    assert 64.4 - 62.4 > 2.0
    for base, tuned in [(64.1, 62.1), (64.4, 62.4)]:
        m = RunMetrics(mmlu_base_points=base, mmlu_tuned_points=tuned)
        assert _by_name(EvidenceBar().evaluate(m))["MMLU drop <= 2 pts"].passed is True


def test_wilson_interval_by_hand():
    # p = 0.5, n = 100: centre 0.5, half = 1.96 * sqrt(0.0025 + 1.96^2 / 40000) / (1 + 1.96^2 / 100) = 0.0962
    low, high = wilson_interval(0.5, 100)
    assert (low, high) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    assert wilson_interval(0.0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson_interval(0.0, 10)[1] > 0.2


@pytest.mark.parametrize("base,n,status", [(24.8, 14042, NOT_MEASURED),   # SmolLM2-135M: at chance
                                           (26.0, 500, NOT_MEASURED),     # above 25, but the CI reaches it
                                           (26.5, 14042, PASS),           # CI low 25.8 > 25
                                           (45.0, 2000, PASS)])
def test_mmlu_at_chance_cannot_pass(base, n, status):
    m = RunMetrics(mmlu_base_points=base, mmlu_tuned_points=base - 0.5, mmlu_n=n)
    r = _by_name(EvidenceBar().evaluate(m))["MMLU drop <= 2 pts"]
    assert r.status == status
    if status == NOT_MEASURED:
        assert "a regression cannot be seen" in r.detail and verdict([r]) == NOT_MEASURED


def test_mmlu_detail_states_the_detectable_drop():
    m = RunMetrics(mmlu_base_points=45.0, mmlu_tuned_points=44.0, mmlu_n=2000, mmlu_delta_ci_points=(-3.1, 1.1))
    r = _by_name(EvidenceBar().evaluate(m))["MMLU drop <= 2 pts"]
    assert r.status == PASS and "detectable drop ~2.1 pts" in r.detail


@pytest.mark.parametrize("mean_after,status", [(130.0, PASS), (131.0, FAIL), (80.0, PASS)])
def test_length_ratio_edge(mean_after, status):
    r = _by_name(EvidenceBar().evaluate(_metrics(mean_after=mean_after)))["length ratio <= 1.3x"]
    assert r.status == status
    assert r.value == pytest.approx(mean_after / 100.0)


def test_not_measured_is_never_a_pass():
    m = RunMetrics(mmlu_base_points=45.0, mmlu_tuned_points=44.0,
                   not_measured={"MT-Bench": "no capable judge"})
    res = _by_name(EvidenceBar().evaluate(m))
    assert res["MT-Bench"].status == NOT_MEASURED and res["MT-Bench"].passed is None
    assert res["MT-Bench"].detail == "no capable judge"
    assert res["target improved (CI low > 0)"].status == NOT_MEASURED
    assert res["length ratio <= 1.3x"].value is None
    assert verdict(list(res.values())) == NOT_MEASURED  # the target, a bar criterion, was not measured
    beside = EvidenceBar().evaluate(_metrics(not_measured={"MT-Bench": "no judge"}))
    assert verdict(beside) == PASS and verdict_text(beside) == "PASS; not measured: MT-Bench"
    assert verdict(EvidenceBar().evaluate(_metrics(ci_low=-0.1, not_measured={"MT-Bench": "x"}))) == FAIL


def test_custom_thresholds():
    bar = EvidenceBar(mmlu_max_drop_points=1.0, max_length_ratio=1.1)
    res = _by_name(bar.evaluate(_metrics(mmlu_tuned=43.5, mean_after=115.0)))
    assert res["MMLU drop <= 1 pts"].status == FAIL
    assert res["length ratio <= 1.1x"].status == FAIL


def test_binary_target_detail_names_both_tests():
    base, tuned = _binary_example()
    cmp = compare_paired_binary(base, tuned, n_resamples=500)
    r = EvidenceBar().evaluate(RunMetrics(target=cmp))[0]
    assert r.value == cmp.diff.ci_low
    assert r.detail.startswith("+0.300, 95% CI [") and r.detail.endswith(", McNemar p=0.109")

# ---------------------------------------------------------------------------------------------
# markdown


def test_render_evidence_table():
    bar = EvidenceBar()
    rows = {"dpo β=0.1": bar.evaluate(_metrics()),
            "ipo": bar.evaluate(_metrics(mmlu_tuned=42.99)),
            "orpo": bar.evaluate(RunMetrics(not_measured={"MT-Bench": "no capable judge"}))}
    lines = render_evidence_table(rows).splitlines()
    assert lines[0] == "| criterion | dpo β=0.1 | ipo | orpo |"
    assert lines[1] == "|---|---|---|---|"
    assert lines[2] == ("| target improved (CI low > 0) | PASS (+0.060, 95% CI [+0.010, +0.110]) "
                        "| PASS (+0.060, 95% CI [+0.010, +0.110]) | not measured (no paired target scores) |")
    assert "| FAIL (drop 2.01 pts (45.00 -> 42.99)) |" in lines[3]
    assert lines[4].split(" | ")[1] == "PASS (1.20x (100.0 -> 120.0 tokens, hit limit 0% -> 4%))"
    # MT-Bench only measured (not) in orpo: the other runs show it as not measured too
    assert lines[5] == "| MT-Bench | not measured | not measured | not measured (no capable judge) |"
    # dpo passes the bar, MT-Bench named beside it; orpo lacks the bar's criteria, so it is not measured
    assert lines[6] == "| **verdict** | **PASS; not measured: MT-Bench** | **FAIL** | **not measured** |"
    assert len(lines) == 7


def test_render_all_pass_verdict_and_escaping():
    rows = {"a|b": [CriterionResult("x", 1.0, 2.0, True, "1 | 2")]}
    text = render_evidence_table(rows)
    assert text.splitlines() == ["| criterion | a\\|b |", "|---|---|", "| x | PASS (1 \\| 2) |",
                                 "| **verdict** | **PASS** |"]
    assert math.isnan(EvidenceBar().evaluate(RunMetrics(not_measured={"m": "r"}))[-1].threshold)
