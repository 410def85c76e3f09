"""The held-out learning curve (eval.every): points at step 0 and every N steps, each the greedy pass@1 of the
weights after that many steps on the first eval.curve_limit held-out examples."""
from __future__ import annotations

from scalelab.core.config import load_config
from scalelab.core.rundir import RunDir
from scalelab.grpo.config import GrpoConfig
from scalelab.grpo.curve import read_curve
from scalelab.grpo.heldout import base_key, eval_run, load_eval
from scalelab.grpo.report import build_report
from scalelab.grpo.train import train
from tests.grpo.test_heldout import TINY
from tests.grpo.tiny import tiny_parts

CURVE = [*TINY, "train.max_steps=4", "eval.every=2", "eval.curve_limit=4", "eval.samples=0"]


def _curve(tmp_path, *more):
    cfg = load_config(GrpoConfig, None, [*CURVE, *more, f"run.out_dir={tmp_path}", "run.name=c"])
    logged = []
    train(cfg, tiny_parts(cfg, eos_bias=2.0), log=logged.append)
    return cfg, read_curve(list(RunDir(cfg.run_dir).events())), logged


def test_curve_points_are_the_subset_scores_of_the_weights_at_their_step(tmp_path):
    cfg, points, logged = _curve(tmp_path)
    assert [p["step"] for p in points] == [0, 2, 4]
    assert [p["weights_version"] for p in points] == [0, 2, 4]
    base, trained = load_eval(cfg.run_dir, "base"), load_eval(cfg.run_dir, "trained")
    for p, ev in ((points[0], base), (points[2], trained)):
        # the same weights, greedy, on the first four held-out examples: the end-of-run evaluation's verdicts
        want = "".join("1" if r.greedy_correct else "0" for r in ev.examples[:4])
        assert p["correct"] == want and p["n"] == 4
        assert p["greedy_pass1"] == want.count("1") / 4
    # the end points are read off the end-of-run evaluations, not generated a second time
    assert [p["source"] for p in points] == ["base evaluation", "measured", "trained evaluation"]
    assert points[1]["greedy_tokens_mean"] != points[0]["greedy_tokens_mean"]  # the weights moved
    assert any("held-out curve, step 2" in line for line in logged)
    text = build_report(cfg.run_dir).read_text()
    assert "## Held-out curve" in text
    for p in points:
        assert f"| {p['step']} | {100 * p['greedy_pass1']:.1f}% | — | {p['greedy_tokens_mean']:.0f} |" in text


def test_without_the_end_of_run_evaluation_the_end_points_are_measured(tmp_path):
    cfg, points, _ = _curve(tmp_path, "eval.at_end=false")
    assert [p["step"] for p in points] == [0, 2, 4] and {p["source"] for p in points} == {"measured"}
    assert load_eval(cfg.run_dir, "base") is None  # a curve point is not the base evaluation
    # scored after the fact from the checkpoint: the measured end points had the base's and step 4's weights
    eval_run(cfg.run_dir, parts=tiny_parts(cfg, eos_bias=2.0), log=lambda s: None)
    for p, policy in ((points[0], "base"), (points[2], "trained")):
        ev = load_eval(cfg.run_dir, policy)
        assert p["correct"] == "".join("1" if r.greedy_correct else "0" for r in ev.examples[:4])
        assert p["greedy_tokens_mean"] == sum(r.greedy_tokens for r in ev.examples[:4]) / 4


def test_the_curve_settings_leave_the_base_key_alone():
    a = load_config(GrpoConfig, None, TINY)
    b = load_config(GrpoConfig, None, [*TINY, "eval.every=5", "eval.curve_limit=3"])
    assert base_key(a) == base_key(b)
