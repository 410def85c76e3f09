"""REPORT.md of a run and of a sweep, and docs/dpo.md, from hand-made folders: the numbers written are the files'."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.jsonio import write_json
from scalelab.core.rundir import RunDir
from scalelab.dpo.config import load_dpo_config
from tests.dpo.test_battery import hand_battery

PREDICTIONS = {"job": "dpo", "hardware": "cpu", "n_params": 1000, "lora_params": 10, "assumed_mfu": 0.3,
               "mfu_why": "prior", "forward_passes_per_step": 3.0, "step_s": 2.0, "step_s_low": 1.0,
               "step_s_high": 4.0, "train_s": 6.0, "peak_memory_gib": 1.0, "initial_loss": 0.693,
               "heldout_reward_accuracy": 0.7, "heldout_reward_accuracy_low": 0.45,
               "heldout_reward_accuracy_high": 0.9}


def _margins(step: int, mean: float, acc: float) -> dict:
    return {"step": step, "n_pairs": 8, "beta": 0.1, "margin_mean": mean, "margin_std": 0.5, "reward_accuracy": acc,
            "drift_abs_logratio_chosen_nats": 0.1 * step, "hist_edges": [-1.0, 0.0, 1.0, 2.0],
            "hist_counts": [1, 3, 4]}


def hand_run(root: Path, loss: str, beta: float, battery: dict | None, final_loss: float = 0.5) -> Path:
    cfg = load_dpo_config(None, [f"run.out_dir='{root}'", f"run.name='{loss}-beta{beta:g}'", f"train.loss='{loss}'",
                                 f"train.beta={beta}"])
    rd = RunDir(cfg.run_dir).create(cfg)
    rd.log_event("data", source="verifier", sha256="x", n_train=40, n_val=8, verifier={
        "task": "arithmetic", "n_prompts": 48, "samples_per_prompt": 4, "sample_accuracy": 0.3,
        "prompts_informative": 24, "n_pairs": 48})
    rd.log_event("train_start", resume_from=None)
    rd.log_event("margins", **_margins(0, 0.0, 0.0))
    for step, value, acc, step_s in [(1, 0.693, 0.0, 2.5), (2, 0.6, 0.5, 3.0), (3, final_loss, 0.75, 3.5)]:
        rd.log_event("step", step=step, step_s=step_s, peak_memory_gib=1.5)
        rd.log_event("train", step=step, loss=value, rewards_accuracies=acc)
    rd.log_event("margins", **_margins(3, 1.25, 0.875))
    rd.log_event("train_end", wall_s=42.0, adapter_bytes=1000)
    write_json(rd.path / "predictions.json", PREDICTIONS)
    if battery is not None:
        write_json(rd.path / "battery" / "battery.json", {"base_model": "tiny", "base_cache": "x", **battery})
    return rd.path


def test_run_report_from_a_hand_made_folder(tmp_path):
    from scalelab.dpo.report import write_run_report
    run = hand_run(tmp_path, "dpo", 0.1, hand_battery())
    text = write_run_report(run).read_text()
    # predicted vs measured: median of the steps after the first = 3.25 s; steps summed 9 s vs 6 s
    assert "| step time (s, median) | 2.00 | [1.00, 4.00] | 3.25 | 1.62x | yes |" in text
    assert "| training time (s, steps summed) | 6 | - | 9 | 1.50x | - |" in text
    assert "| held-out reward accuracy (last) | 0.70 | [0.45, 0.90] | 0.88 | 1.25x | yes |" in text
    assert "loss 0.693 -> 0.500" in text and "held-out margin mean 0.000 -> 1.250" in text
    # battery: 40% -> 55%, +15 points, CI [+2, +28]
    assert "| target (arithmetic, test) | correct | 200 | 40.0% | 55.0% | +15.0 | [+2.0, +28.0] | 1.7e-05 |" in text
    assert "| mmlu | acc | 1000 | 50.0% | 49.0% | -1.0 | [-3.0, +1.0] | 0.2 |" in text
    assert "| MT-Bench | judge 1-10 | - | not measured | not measured | - | - | no judge endpoint configured |" in text
    assert "| **all** | 100 | 10.0 -> 12.0 | 9 -> 10 | 20 -> 25 | 1.20x | 1% -> 5% |" in text
    assert "Ratio of means 1.20x. Per prompt (own + target tasks, n=100): median ratio 1.10" in text
    assert "PASS (drop 1.00 pts (50.00 -> 49.00); detectable drop ~2.0 pts)" in text
    assert "Verdict: **PASS; not measured: MT-Bench**." in text
    for fig in ("training", "margins"):
        assert f"![{fig}](figures/{fig}.png)" in text and (run / "figures" / f"{fig}.png").stat().st_size > 1000


def test_run_report_without_battery_says_so(tmp_path):
    from scalelab.dpo.report import write_run_report
    text = write_run_report(hand_run(tmp_path, "dpo", 0.1, None)).read_text()
    assert "## Regression battery" in text and "Not run" in text and "## Evidence bar" not in text


def make_sweep(root: Path) -> Path:
    sweep = root / "s"
    hand_run(sweep, "dpo", 0.05, hand_battery(target=(0.4, 0.5, 0.03, 0.17), mmlu=(0.5, 0.47)), final_loss=0.3)
    hand_run(sweep, "dpo", 0.1, hand_battery(target=(0.4, 0.46, 0.01, 0.11)), final_loss=0.4)
    hand_run(sweep, "dpo", 0.3, hand_battery(target=(0.4, 0.48, 0.02, 0.14), lengths=(10.0, 15.0)))
    hand_run(sweep, "ipo", 0.1, hand_battery(target=(0.4, 0.44, -0.02, 0.10)))
    return sweep


def test_sweep_chooses_the_best_target_among_runs_passing_mmlu_and_length(tmp_path):
    from scalelab.dpo.report import write_report
    from scalelab.dpo.sweep_report import choose, find_runs, sweep_row
    from scalelab.dpo.report import load_run
    sweep = make_sweep(tmp_path)
    rows = [sweep_row(load_run(p)) for p in find_runs(sweep)]
    assert [r.run for r in rows] == ["dpo-beta0.05", "dpo-beta0.1", "dpo-beta0.3", "ipo-beta0.1"]
    assert [(r.mmlu_status, r.length_status) for r in rows] == [
        ("FAIL", "PASS"), ("PASS", "PASS"), ("PASS", "FAIL"), ("PASS", "PASS")]
    choice = choose(rows)
    # +10 (beta 0.05) fails MMLU (-3 pts), +8 (beta 0.3) fails length (1.5x): +6 at beta 0.1 beats IPO's +4
    assert choice.row.run == "dpo-beta0.1" and choice.eligible == ("dpo-beta0.1", "ipo-beta0.1")
    text = write_report(sweep).read_text()
    assert "**dpo β=0.1** (`dpo-beta0.1`): the largest target gain (+6.0 pts) among the 2 of 4 runs" in text
    assert "| dpo-beta0.05 | dpo | 0.05 | 0.300 | 0.88 | 1.250 | +10.0 | [+3.0, +17.0] | -3.00 | 1.20x | FAIL |" in text
    assert "| dpo-beta0.3 | dpo | 0.3 | 0.500 | 0.88 | 1.250 | +8.0 | [+2.0, +14.0] | -1.00 | 1.50x | FAIL |" in text
    assert "[ipo β=0.1](ipo-beta0.1/REPORT.md)" in text
    assert all((sweep / r.run / "REPORT.md").is_file() for r in rows)


def test_no_beta_is_chosen_when_none_passes(tmp_path):
    from scalelab.dpo.sweep_report import choose, sweep_row
    from scalelab.dpo.report import load_run
    run = hand_run(tmp_path / "s", "dpo", 0.1, hand_battery(mmlu=(0.6, 0.5)))
    choice = choose([sweep_row(load_run(run))])
    assert choice.row is None and "no β is chosen" in choice.reason


def test_docs_from_a_sweep(tmp_path):
    from scalelab.dpo.docs import write_docs
    sweep = make_sweep(tmp_path)
    out = write_docs(sweep, tmp_path / "docs" / "dpo.md")
    text = out.read_text()
    # the runs carry a [selection] table: the page's choice is the rule's, from training-time held-out accuracy
    # (0.875 for all three DPO runs: tied, so the larger beta), and the battery's best row is shown apart
    assert "Rule, fixed in the config's [selection] table before the runs: among the trained dpo runs" in text
    assert "**Chosen: dpo β=0.3**: held-out reward accuracy 0.875 (best 0.875) at beta 0.3, tied with" in text
    assert "moves the target task from 40.0% to 48.0% (+8.0 points, 95% CI [+2.0, +14.0])" in text
    assert ("Best battery row, after the fact (picked on the numbers it reports, so optimistic; not the choice): "
            "dpo β=0.1: the largest target gain (+6.0 pts) among the 2 of 4 runs") in text
    assert "48 `arithmetic` prompts, 30.0% graded right; 24 prompts had both" in text
    assert "| dpo-beta0.3 | dpo | 0.3 |" in text and "MT-Bench: no judge endpoint configured" in text
    # the featured run's figures are linked where the run keeps them, relative to the page: no copy in docs/
    link = text.split("![margins](", 1)[1].split(")", 1)[0]
    assert link.endswith("/figures/margins.png") and link.startswith("../")
    assert (out.parent / link).resolve().stat().st_size > 1000 and not (tmp_path / "docs" / "figures").exists()
    assert 900 <= len(text.split()) <= 2000


def test_cli_report_and_docs(tmp_path, capsys):
    from scalelab.cli import main
    sweep = make_sweep(tmp_path)
    assert main(["dpo", "report", str(sweep)]) == 0
    assert (sweep / "REPORT.md").is_file()
    assert main(["dpo", "docs", str(sweep), "--out", str(tmp_path / "d" / "dpo.md")]) == 0
    assert (tmp_path / "d" / "dpo.md").is_file()
    with pytest.raises(FileNotFoundError, match="no run folders"):
        main(["dpo", "report", str(tmp_path / "d")])
    assert json.loads((sweep / "dpo-beta0.1" / "battery" / "battery.json").read_text())["base_model"] == "tiny"
