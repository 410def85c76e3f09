"""groupsignal: the no-signal share of GRPO groups, counted from a run's rewards and forecast at other group sizes
from a beta-binomial fit; values worked out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.cli import main as cli
from scalelab.grpo.groupsignal import correct_counts, fit_beta_binomial, forecast, zero_signal

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results/h100/grpo/qwen2.5-coder-0.5b-gsm8k/recipe-lr5e-5-s1"


def test_uniform_pass_rates_give_two_in_g_plus_one():
    # p ~ Beta(1, 1): P(all wrong) = P(all right) = integral of p^G = 1 / (G + 1)
    for g in (1, 4, 8, 16):
        assert zero_signal(1.0, 1.0, g) == pytest.approx(2 / (g + 1), rel=1e-12)


def test_a_sharp_pass_rate_is_the_binomial():
    # Beta(1e6, 1e6) is p = 0.5 to within 0.0005: 2 * 0.5^8 = 1/128
    assert zero_signal(1e6, 1e6, 8) == pytest.approx(1 / 128, rel=1e-3)


def test_moments_fit_by_hand():
    # k = 0, 8, 4, 4 of 8: mean 0.5, variance 8 against the binomial's 2, so rho = (8/2 - 1) / 7 = 3/7,
    # a + b = 1/rho - 1 = 4/3, a = b = 2/3
    a, b = fit_beta_binomial([0, 8, 4, 4], 8)
    assert (a, b) == (pytest.approx(2 / 3), pytest.approx(2 / 3))


@pytest.mark.parametrize("k, match", [([0, 0, 0], "no spread"), ([8, 8], "no spread"),
                                      ([4, 4, 4, 4], "not overdispersed")])
def test_a_fit_without_spread_is_refused(k, match):
    with pytest.raises(ValueError, match=match):
        fit_beta_binomial(k, 8)


def test_counts_per_group_and_a_ragged_step():
    steps = [{"step": 0, "completion_rewards": {"correctness": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]}},
             {"step": 1, "completion_rewards": {"correctness": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]}}]
    assert correct_counts(steps, 4).tolist() == [3, 0, 4, 1]
    with pytest.raises(ValueError, match="step 0: 8 rewards are not groups of 3"):
        correct_counts(steps, 3)


def test_forecast_keeps_the_sequences_per_step():
    rows = forecast(1.0, 1.0, [4, 8, 16], 256)
    assert [r.prompts for r in rows] == [64, 32, 16]
    assert rows[1].zero_signal == pytest.approx(2 / 9)
    assert rows[1].prompts_with_signal == pytest.approx(32 * 7 / 9)
    assert rows[2].rows_with_signal == pytest.approx(256 * 15 / 17)


def test_the_committed_seed_1_run_counts_what_it_logged(capsys):
    if not (RUN / "config.toml").is_file():
        pytest.skip("committed run not present")
    assert cli(["grpo", "signal", str(RUN), "--steps=-40", "--group-sizes", "8,16"]) == 0
    out = capsys.readouterr().out
    # its last 40 steps: 1,280 groups of 8; the count from correctness alone is within 0.01 of the logged share
    # (which reads the total reward, format bonus included)
    assert "40 steps, 1,280 groups of 8: counted no-signal share 0.491 (logged zero_signal_frac 0.489)" in out
    eight = next(line for line in out.splitlines() if line.startswith("| 8 |"))
    assert eight.startswith("| 8 | 32 | 0.490 |")  # the fit gives back the share it was fitted on
