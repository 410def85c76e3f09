"""The ladder law's out-of-sample scoring: refits that leave out the largest budget or model, scored on them."""
import pytest

from scalelab.pretrain.ladder_check import check_ladder, hold_out, to_points
from scalelab.pretrain.scaling_law import ScalingLaw

TRUE = ScalingLaw(E=2.0, A=400.0, B=400.0, alpha=0.34, beta=0.28, rel_interval=0.0, source="synthetic")
SIZES = (16e6, 30e6, 51e6, 124e6)
BUDGETS = (4_194_304, 8_388_608, 16_777_216, 33_554_432)


def rows(bump_largest_d: float = 1.0) -> list[dict]:
    """Ladder points on the law TRUE; the largest budget's losses multiplied by bump_largest_d."""
    return [{"n_params": n, "tokens": d, "final_val_loss": TRUE.loss(n, d) * (bump_largest_d if d == BUDGETS[-1]
                                                                               else 1.0)}
            for n in SIZES for d in BUDGETS]


def test_points_on_the_law_are_predicted_out_of_sample():
    doc = check_ladder(rows(), {"350M": 350e6})
    for h in doc["held_out"]:
        assert h["fitted_on"] == 12 and h["max_abs_error"] < 1e-3, h
    (pred,) = doc["predictions"]
    assert pred["tokens"] == BUDGETS[-1] and pred["loss"] == pytest.approx(TRUE.loss(350e6, BUDGETS[-1]), rel=1e-3)
    assert doc["prediction_interval"] == pytest.approx(0.02)   # the floor: no fit claims better than 2%
    lo, hi = pred["interval"]
    assert lo == pytest.approx(pred["loss"] * 0.98) and hi == pytest.approx(pred["loss"] * 1.02)
    assert doc["tokens_per_param_max"] == pytest.approx(BUDGETS[-1] / SIZES[0])


def test_a_budget_off_the_law_shows_as_the_held_out_error_and_widens_the_interval():
    points = to_points(rows(bump_largest_d=1.05))   # the largest budget lands 5% above the law
    held = hold_out(points, "largest D")
    assert held.fitted_on == 12 and len(held.errors) == 4
    for e in held.errors:   # the refit (on the law) predicts the law: 1/1.05 - 1 of the measured value
        assert e["rel_error"] == pytest.approx(1 / 1.05 - 1, abs=1e-3)
    doc = check_ladder(rows(bump_largest_d=1.05), {"350M": 350e6})
    assert doc["prediction_interval"] >= abs(1 / 1.05 - 1) - 1e-3


def test_unknown_split_is_refused():
    with pytest.raises(KeyError):
        hold_out(to_points(rows()), "largest lr")


def test_joint_form_predicts_points_on_its_own_law():
    """Kaplan et al. 2020's published joint law (eq. 1.5): a fit on 16 of its points predicts an unseen size and
    budget; the size effect it fits shrinks as data gets scarce, which the additive form cannot do."""
    from scalelab.pretrain.kaplan_law import KaplanLaw, fit_kaplan_law
    from scalelab.pretrain.scaling_law import LossPoint
    true = KaplanLaw(n_c=8.8e13, d_c=5.4e13, alpha_n=0.076, alpha_d=0.095, rel_interval=0.0, source="published")
    points = [LossPoint(n, d, true.loss(n, d)) for n in SIZES for d in BUDGETS]
    law = fit_kaplan_law(points)
    for n, d in ((350e6, BUDGETS[-1]), (124e6, 2 * BUDGETS[-1])):
        assert law.loss(n, d) == pytest.approx(true.loss(n, d), rel=5e-3)
    gain = lambda d: law.loss(SIZES[0], d) - law.loss(SIZES[-1], d)  # noqa: E731  bigger model's advantage
    assert 0 < gain(BUDGETS[0]) < gain(BUDGETS[-1])


def test_check_ladder_scores_both_forms():
    doc = check_ladder(rows(), {"350M": 350e6})
    joint = doc["joint"]
    assert joint["law"]["alpha_d"] > 0 and len(joint["held_out"]) == 2
    assert joint["predictions"][0]["size"] == "350M" and joint["prediction_interval"] >= 0.02


def test_joint_form_refuses_too_few_points():
    from scalelab.pretrain.kaplan_law import fit_kaplan_law
    with pytest.raises(ValueError, match="need >= 5"):
        fit_kaplan_law(to_points(rows())[:4])
