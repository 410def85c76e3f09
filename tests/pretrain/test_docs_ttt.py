"""docs/pretrain.md's time-to-target and lm-eval sections from hand-made folders: the grid's best marked with its
held-out loss, the seeds' rows, "not complete" until both sides have their seeds, then the verdict's numbers as
stats.json holds them."""
from __future__ import annotations

import json
from pathlib import Path

from scalelab.pretrain.docs_ttt import lm_eval_section, load_ttt, ttt_section

NO_FIGURE = lambda name, caption: []  # noqa: E731


def make_run(root: Path, layout: str, loss: float, tokens_per_s: float, train: str = "") -> None:
    d = root / layout
    d.mkdir(parents=True)
    (d / "train_summary.json").write_text(json.dumps({"final_val_loss": loss, "tokens": 3000, "tokens_per_s":
                                                      tokens_per_s}))
    (d / "provenance.json").write_text(json.dumps({"hardware": {"gpus": ["GPU X"]}}))
    (d / "config.toml").write_text(f"[optim]\nlr = 0.0006\n[train]\ntotal_batch_tokens = 1000\nval_every = 10\n{train}")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"event": "val", "tokens": t, "val_loss": v}) + "\n"
                                             for t, v in ((1000, 7.0), (3000, loss))))


def folder(tmp_path: Path, stats: dict) -> Path:
    root = tmp_path / "ttt"
    for lr, loss in (("1e-4", 5.6), ("2e-4", 5.5), ("4e-4", 5.7)):
        make_run(root, f"grid/lr-{lr}", loss, 1000.0)
    make_run(root, "baseline/seed-1", 5.45, 2000.0)
    (root / "stats.json").write_text(json.dumps(stats))
    return root


GRID = {"status": "tuned", "best_lr": 2e-4, "next_lr": None, "lrs": [1e-4, 2e-4, 4e-4], "losses": [5.6, 5.5, 5.7]}
LOSSES = {"grid/lr-2e-4": {"val_loss": 5.5, "wikitext2_loss": 7.25}}


def test_incomplete_study_shows_the_grid_and_seeds_and_says_so(tmp_path):
    t = load_ttt(folder(tmp_path, {"grid": GRID, "status": "incomplete: grid tuned, 1 baseline and 0 recipe seeds",
                                   "losses": LOSSES}), "res/ttt")
    text = "\n".join(ttt_section(t, NO_FIGURE))
    assert "One pass = 3 steps of 1,000 tokens" in text and "every 10 steps" in text
    assert "| **2e-4** | **5.500** | 7.250 |" in text and "| 1e-4 | 5.600 | — |" in text
    assert "the best, 2e-4, lies strictly inside the grid" in text
    assert "| baseline/seed-1 | 5.450 | — | 0.0M | 2k | GPU X |" in text
    assert "Not complete (incomplete: grid tuned, 1 baseline and 0 recipe seeds)" in text
    # margin 5.6 - 5.5 = 0.100 against the spread of seed 0 (5.50) and seed 1 (5.45) at 2e-4: 0.050
    assert "Its margin over the next lr (0.100) is larger than the spread of 2 seeds at the chosen lr (0.050" in text
    assert "Welch" not in text


def test_finished_study_states_target_times_and_test(tmp_path):
    side = lambda n, s, sd, tok: {"n": n, "reached": n, "train_s_mean": s, "train_s_std": sd,  # noqa: E731
                                  "tokens_mean": tok, "tokens_std": 1e5, "censored": []}
    stats = {"grid": GRID, "status": "done", "losses": LOSSES, "target_val_loss": 5.4812,
             "baseline": side(5, 70.0, 1.5, 30e6), "recipe": side(5, 30.25, 2.0, 15e6),
             "welch_train_s": {"t": -35.5, "df": 7.4, "p_less": 1.2e-9}, "welch_tokens": {"t": -3.0, "df": 8.0,
                                                                                          "p_less": 0.004},
             "ratio_train_s": 30.25 / 70.0, "ratio_tokens": 0.5, "alpha": 0.01, "min_seeds": 5,
             "faster": True, "goal_ratio": 0.5, "goal_met": True}
    root = folder(tmp_path, stats)
    make_run(root, "recipe/seed-1", 5.47, 2100.0, 'optimizer = "muon"\nattention = "cudnn"\nloss_chunks = 8\n')
    stats["losses"] = {**LOSSES, "baseline/seed-1": {"wikitext2_loss": 7.6}, "recipe/seed-1": {"wikitext2_loss": 7.4}}
    (root / "stats.json").write_text(json.dumps(stats))
    text = "\n".join(ttt_section(load_ttt(root, "res/ttt"), NO_FIGURE))
    assert "**5.481**" in text and "| recipe | 5 | 5 | 30.2 ± 2.0 | 15.00M ± 0.10M |" in text
    assert "**Recipe / baseline time to target: 0.432** (tokens: 0.500)" in text
    assert "t = -35.50, df = 7.4, p = 1.2e-09" in text and "**faster**" in text and "goal ≤ 0.5x: met" in text
    # the reading: 2100 / 2000 tokens/s, 10 steps of 1,000 tokens, the recipe stopping at 3000 tokens = step 3
    assert "The recipe (Muon at lr 0.0006 with cuDNN attention and the loss in 8 chunks) runs at 1.05x" in text
    assert "every 10 steps (0.01M tokens; the recipe stopped at step 3)" in text
    assert "the recipe at the target scores 7.400 on average, the baseline after its pass 7.600" in text


def test_no_stats_no_section(tmp_path):
    assert load_ttt(tmp_path, "x") is None and ttt_section(None, NO_FIGURE) == []


def test_lm_eval_table_in_percent_with_stderr_and_unscored_tasks(tmp_path):
    metric = lambda a, se, n: [{"name": "acc", "value": a, "stderr": se},  # noqa: E731
                               {"name": "acc_norm", "value": n, "stderr": se}]
    (tmp_path / "eval.json").write_text(json.dumps({"tasks": [
        {"name": "hellaswag", "metrics": metric(0.2604, 0.0044, 0.2514), "n_examples": 10042},
        {"name": "piqa", "metrics": metric(0.531, 0.0116, 0.5087), "n_examples": 1838}]}))
    text = "\n".join(lm_eval_section(((tmp_path / "eval.json", "m"),)))
    assert "| m | 26.0 ± 0.4 / 25.1 (10,042) | not scored | 53.1 ± 1.2 / 50.9 (1,838) |" in text
    # (0.2604 - 0.25) / 0.0044 = 2.36 standard errors on HellaSwag, (0.531 - 0.5) / 0.0116 = 2.67 on PIQA
    assert "No score is more than 2.7 standard errors above chance (piqa, m)." in text
    assert "PIQA 50%" in text and lm_eval_section(()) == []
