"""pass@k, the paired bootstrap and the across-seed interval against values worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.grpo.passk import mean_pass_at_k, paired_bootstrap, pass_at_k, seed_interval


@pytest.mark.parametrize("n,c,k,expected", [
    (10, 3, 1, 0.3),                                    # k = 1 is c / n
    (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),   # 1 - 3/10 = 0.7
    (4, 1, 3, 0.75),                                    # 1 - C(3,3)/C(4,3) = 1 - 1/4
    (5, 0, 3, 0.0),                                     # nothing right: never passes
    (5, 3, 3, 1.0),                                     # n - c = 2 < k = 3: any 3 draws hold a right one
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_enumeration_of_draws():
    # 6 samples, 2 right, k = 3: 20 subsets of 3, those without a right one: C(4, 3) = 4 -> 16/20
    assert pass_at_k(6, 2, 3) == pytest.approx(0.8)
    assert mean_pass_at_k([6, 4], [2, 0], 3) == pytest.approx((0.8 + 0.0) / 2)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_paired_bootstrap_by_hand():
    d = paired_bootstrap([0, 1, 0, 1], [1, 1, 1, 1], resamples=500)
    assert (d.base, d.trained, d.delta) == (0.5, 1.0, 0.5)
    # differences 1, 0, 1, 0: a resample of 4 has mean k/4 with k ~ Binomial(4, 1/2), so the 2.5% and 97.5%
    # quantiles are 0 (P = 1/16 > 2.5%) and 1 (P = 1/16): the interval touches zero
    assert (d.ci_low, d.ci_high) == (0.0, 1.0) and not d.excludes_zero
    same = paired_bootstrap([0.2, 0.7, 0.1], [0.5, 1.0, 0.4], resamples=200)
    assert same.ci_low == pytest.approx(0.3) and same.ci_high == pytest.approx(0.3) and same.excludes_zero


def test_pairing_narrows_the_interval():
    rng = np.random.default_rng(0)
    base = rng.random(200)
    trained = base + 0.05  # every example up by exactly 5 points: paired CI is a point, unpaired would be wide
    d = paired_bootstrap(base, trained, resamples=1000)
    assert d.ci_high - d.ci_low < 1e-9 and d.delta == pytest.approx(0.05)


def test_seed_interval_by_hand():
    s = seed_interval([2.0, 4.0, 6.0])
    # mean 4, sd 2, t(0.975, df=2) = 4.302653 -> half width 4.302653 * 2 / sqrt(3) = 4.968275
    assert (s.mean, s.std) == (4.0, 2.0)
    assert s.ci_low == pytest.approx(4 - 4.968275, abs=1e-5) and s.ci_high == pytest.approx(4 + 4.968275, abs=1e-5)
    one = seed_interval([7.0])
    assert one.ci_low is None and one.mean == 7.0
