"""The [selection] rule on hand-built sweep results: the best held-out reward accuracy, the tie rule, what is not
eligible, the plateau flags; the sweep report and selection.json state the rule and the chosen run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.rundir import RunDir
from scalelab.dpo.config import SelectionConfig, load_dpo_config
from scalelab.dpo.selection import Candidate, plateaued, select


def cand(run: str, beta: float, acc: float | None, loss: str = "dpo", trained: bool = True,
         settled: bool | None = True) -> Candidate:
    return Candidate(run, loss, beta, trained, acc, 1.0, 10, settled, settled)


def test_the_highest_heldout_accuracy_wins_outside_the_tolerance():
    sel = select([cand("a", 0.05, 0.80), cand("b", 0.1, 0.85), cand("c", 0.3, 0.82)], SelectionConfig())
    assert sel.chosen.run == "b" and sel.tied == ("b",) and not sel.provisional
    assert "0.850" in sel.reason and "every candidate plateaued" in sel.reason


def test_a_tie_within_the_tolerance_goes_to_the_larger_beta():
    runs = [cand("dpo-beta0.05", 0.05, 0.860), cand("dpo-beta0.1", 0.1, 0.850), cand("dpo-beta0.3", 0.3, 0.841),
            cand("dpo-beta1", 1.0, 0.830)]
    sel = select(runs, SelectionConfig())                                   # 0.86 - 0.02 = 0.84: three tied
    assert sel.tied == ("dpo-beta0.05", "dpo-beta0.1", "dpo-beta0.3") and sel.chosen.run == "dpo-beta0.3"
    assert "tied with dpo-beta0.05, dpo-beta0.1; the tie goes to the larger beta" in sel.reason
    smaller = select(runs, SelectionConfig(tie_break="smaller_beta"))
    assert smaller.chosen.run == "dpo-beta0.05"
    exact = select(runs, SelectionConfig(tie_tolerance=0.0))
    assert exact.tied == ("dpo-beta0.05",) and exact.chosen.run == "dpo-beta0.05"
    # at the tolerance's edge a run is tied: 0.86 - 0.84 = 0.02 exactly
    edge = select([cand("x", 0.1, 0.86), cand("y", 0.3, 0.84)], SelectionConfig())
    assert edge.chosen.run == "y"


def test_equal_beta_and_accuracy_fall_back_to_the_run_name():
    rule = SelectionConfig(losses=["dpo", "ipo"])
    sel = select([cand("ipo-beta0.1", 0.1, 0.8, "ipo"), cand("dpo-beta0.1", 0.1, 0.8)], rule)
    assert sel.chosen.run == "dpo-beta0.1"


def test_untrained_other_losses_and_missing_margins_are_not_eligible():
    runs = [cand("dpo-beta0.05", 0.05, 0.99, trained=False), cand("orpo-beta0.1", 0.1, 0.95, "orpo"),
            cand("dpo-beta0.3", 0.3, None), cand("dpo-beta0.1", 0.1, 0.70, settled=False)]
    sel = select(runs, SelectionConfig())
    assert sel.chosen.run == "dpo-beta0.1" and len(sel.candidates) == 4
    assert sel.provisional and "provisional: not plateaued: dpo-beta0.1" in sel.reason
    none = select(runs[:3], SelectionConfig())
    assert none.chosen is None and "no run is chosen" in none.reason


def test_plateau_over_the_last_quarter_of_steps():
    pts = [{"step": s, "reward_accuracy": a, "margin_mean": m}
           for s, a, m in [(0, 0.0, 0.0), (50, 0.6, 0.5), (100, 0.78, 1.0), (150, 0.80, 1.05), (200, 0.81, 1.3)]]
    # window: steps >= 150: accuracy 0.80 -> 0.81 (moved 0.01 <= 0.02); margin 1.05 -> 1.3 (19% > 10%)
    assert plateaued(pts, "reward_accuracy", 0.25, 0.02, relative=False) is True
    assert plateaued(pts, "margin_mean", 0.25, 0.1, relative=True) is False
    assert plateaued(pts, "reward_accuracy", 0.5, 0.02, relative=False) is False   # from step 100: 0.03
    assert plateaued(pts[-1:], "reward_accuracy", 0.25, 0.02, relative=False) is None


def hand_run(sweep: Path, loss: str, beta: float, accs: list[float], overrides: tuple = ()) -> Path:
    cfg = load_dpo_config(None, [f"run.out_dir='{sweep}'", f"run.name='{loss}-beta{beta:g}'",
                                 f"train.loss='{loss}'", f"train.beta={beta}", *overrides])
    rd = RunDir(cfg.run_dir).create(cfg)
    rd.log_event("train_start", resume_from=None)
    for i, acc in enumerate(accs):
        rd.log_event("margins", step=10 * i, n_pairs=8, beta=beta, margin_mean=beta * i, margin_std=0.1,
                     reward_accuracy=acc, hist_edges=[0.0, 1.0], hist_counts=[8])
    rd.log_event("train_end", wall_s=5.0, adapter_bytes=10)
    return rd.path


def test_sweep_report_and_selection_json_state_the_rule_and_the_chosen_run(tmp_path, capsys):
    from scalelab.cli import main
    from scalelab.dpo.sweep_report import write_sweep_report
    sweep = tmp_path / "s"
    hand_run(sweep, "dpo", 0.05, [0.0, 0.7, 0.86, 0.87])
    hand_run(sweep, "dpo", 0.1, [0.0, 0.7, 0.85, 0.855])
    hand_run(sweep, "dpo", 0.3, [0.0, 0.6, 0.75, 0.80])
    hand_run(sweep, "ipo", 1.0, [0.0, 0.9, 0.95, 0.95])           # not among selection.losses
    text = write_sweep_report(sweep).read_text()
    assert "## Chosen run (rule fixed in [selection] before the runs)" in text
    assert "Rule: among the trained dpo runs, the highest held-out implicit-reward accuracy" in text
    assert "**dpo β=0.1** (`dpo-beta0.1`): held-out reward accuracy 0.855 (best 0.870) at beta 0.1" in text
    assert "| dpo-beta0.3 | dpo | 0.3 | yes | 0.800 | 0.900 | 4 | - | - |" in text   # one point in the window
    saved = json.loads((sweep / "selection.json").read_text())
    assert saved["chosen"]["run"] == "dpo-beta0.1" and saved["tied"] == ["dpo-beta0.05", "dpo-beta0.1"]
    assert main(["dpo", "select", str(sweep), "--name-only"]) == 0
    assert capsys.readouterr().out.strip() == "dpo-beta0.1"


def test_runs_with_different_rules_are_refused(tmp_path, capsys):
    from scalelab.cli import main
    from scalelab.dpo.sweep_report import write_sweep_report
    sweep = tmp_path / "s"
    hand_run(sweep, "dpo", 0.05, [0.0, 0.8])
    hand_run(sweep, "dpo", 0.1, [0.0, 0.8], ("selection.tie_tolerance=0.05",))
    text = write_sweep_report(sweep).read_text()
    assert "The rule could not be applied: the sweep's runs have different [selection] tables" in text
    assert not (sweep / "selection.json").exists()
    with pytest.raises(ValueError, match="fixed once, before the runs"):
        main(["dpo", "select", str(sweep)])
