"""scalelab.pretrain.ttt_stats: Welch's one-sided test on a hand-computed case and against scipy's ttest_ind,
the target and the censoring rule, the verdict's conditions, and the lr-grid rule."""
from __future__ import annotations

import math
import random

import pytest

from scalelab.pretrain.ttt_stats import (ALPHA, MIN_SEEDS, SeedTime, compare, grid_rule, mean_std, seed_time,
                                         target_loss, welch_less)


def test_welch_hand_computed():
    # a: mean 2, s^2 1, v = 1/3; b: mean 6, s^2 2.5, v = 1/2. t = -4 / sqrt(5/6) = -4 sqrt(6/5);
    # df = (5/6)^2 / ((1/3)^2/2 + (1/2)^2/4) = (25/36) / (17/144) = 100/17
    w = welch_less([1, 2, 3], [4, 5, 6, 7, 8])
    assert w.t == pytest.approx(-4 * math.sqrt(6 / 5), rel=1e-12)
    assert w.df == pytest.approx(100 / 17, rel=1e-12)
    assert 0.001 < w.p_less < 0.01  # t = -4.38 on ~5.9 df: p ~ 0.0025


def test_welch_equals_scipy_ttest_ind():
    from scipy.stats import ttest_ind
    rng = random.Random(0)
    for n_a, n_b, shift in [(5, 5, -3.0), (5, 7, 0.5), (6, 5, -0.2), (10, 5, -8.0)]:
        a = [rng.gauss(100 + shift, 2.0) for _ in range(n_a)]
        b = [rng.gauss(100, 5.0) for _ in range(n_b)]
        ours, ref = welch_less(a, b), ttest_ind(a, b, equal_var=False, alternative="less")
        assert ours.t == pytest.approx(float(ref.statistic), rel=1e-10)
        assert ours.p_less == pytest.approx(float(ref.pvalue), rel=1e-8, abs=1e-300)
        assert ours.df == pytest.approx(float(ref.df), rel=1e-10)


def test_welch_edges():
    assert welch_less([1.0, 1.0], [2.0, 2.0]).p_less == 0.0       # constant sides: the sign decides
    assert welch_less([2.0, 2.0], [1.0, 1.0]).p_less == 1.0
    with pytest.raises(ValueError):
        welch_less([1.0], [1.0, 2.0])


def test_target_is_the_baseline_seeds_mean_and_needs_every_seed():
    assert target_loss([3.0, 3.2, 3.1]) == pytest.approx(3.1)
    with pytest.raises(ValueError):
        target_loss([3.0, math.nan])


def test_seed_time_first_evaluation_at_or_below_target_else_censored_at_the_end():
    val = [(100, 1.0, 4.0), (200, 2.0, 3.5), (300, 3.0, 3.4)]
    assert seed_time(1, val, 3.5, end_s=3.5, end_tokens=350) == SeedTime(1, True, 2.0, 200)   # at, not below
    assert seed_time(2, val, 3.0, end_s=3.5, end_tokens=350) == SeedTime(2, False, 3.5, 350)  # never: its end


def _side(times, reached=True, start=0):
    return [SeedTime(start + i, reached, t, int(t * 1000)) for i, t in enumerate(times)]


def test_compare_calls_faster_only_with_enough_seeds_p_below_alpha_and_no_censored_recipe():
    base = _side([100, 102, 98, 101, 99], reached=False)  # a censored baseline counts at its end
    fast = _side([40, 42, 41, 39, 43])
    v = compare(base, fast, target=3.3)
    assert v["faster"] and v["goal_met"] and v["welch_train_s"]["p_less"] < ALPHA
    assert v["baseline"]["censored"] == [0, 1, 2, 3, 4] and v["recipe"]["reached"] == 5
    assert v["ratio_train_s"] == pytest.approx(41 / 100)
    assert (v["baseline"]["train_s_mean"], v["baseline"]["train_s_std"]) == pytest.approx(mean_std([100, 102, 98,
                                                                                                     101, 99]))
    assert v["recipe"]["train_s_std"] == pytest.approx(math.sqrt(2.5))    # sample std (n - 1) of 39..43
    censored = fast[:4] + [SeedTime(9, False, 60.0, 60000)]
    assert not compare(base, censored, 3.3)["faster"]                   # a lower bound cannot help the recipe
    assert not compare(base[:MIN_SEEDS - 1], fast, 3.3)["faster"]       # too few seeds
    slow = _side([70, 95, 60, 99, 110])
    assert compare(base, slow, 3.3)["welch_train_s"]["p_less"] > ALPHA and not compare(base, slow, 3.3)["faster"]
    half = compare(base, _side([60, 61, 59, 60, 60]), 3.3)
    assert half["faster"] and not half["goal_met"]                      # faster, but not <= 0.5x


GRID = [1e-4, 3e-4, 1e-3, 3e-3]


def test_grid_tuned_when_the_best_is_inside():
    r = grid_rule(GRID, [3.9, 3.5, 3.6, 4.2])
    assert (r.status, r.best_lr, r.next_lr) == ("tuned", 3e-4, None)


def test_grid_extends_toward_a_best_at_an_end_by_the_grids_own_step():
    low = grid_rule(list(reversed(GRID)), [3.9, 3.8, 3.7, 3.6])   # order given does not matter
    assert (low.status, low.best_lr) == ("extend low", 1e-4) and low.next_lr == pytest.approx(1e-4 / 3)
    high = grid_rule(GRID, [4.0, 3.9, 3.8, 3.7])
    assert (high.status, high.best_lr) == ("extend high", 3e-3) and high.next_lr == pytest.approx(9e-3)
    assert grid_rule(GRID, [3.6, 3.5, 3.7, 3.5]).status == "extend high"  # a tie with an end is at the end


def test_grid_diverged_runs_count_as_worst_and_small_grids_are_too_few():
    r = grid_rule(GRID, [3.9, 3.5, math.nan, math.inf])
    assert r.status == "tuned" and r.losses[2:] == (math.inf, math.inf)
    assert grid_rule(GRID, [math.nan] * 4).status == "extend low"
    assert grid_rule(GRID[:3], [3.9, 3.5, 3.6]).status == "too few"
    none_yet = grid_rule([], [])  # a first call cut off before any grid run finished
    assert (none_yet.status, none_yet.best_lr, none_yet.next_lr) == ("too few", None, None)
    with pytest.raises(ValueError):
        grid_rule([1e-3, 1e-3, 2e-3, 3e-3], [1, 2, 3, 4])
