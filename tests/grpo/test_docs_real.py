"""The real-model blocks of `scalelab grpo docs MANIFEST` (grpo.docs_real) from hand-made run folders: every number
asserted is worked out by hand from the files written here; one test reads the committed runs and checks the value
their README quotes."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from scalelab.core.jsonio import write_json
from scalelab.grpo.docs_real import base_items, held_out_points, paired_battery, read_run
from tests.grpo.test_docs_blocks import page

REPO = Path(__file__).resolve().parents[2]


def step(n: int, **over) -> dict:
    """A grpo_step event with the keys the docs read; `over` replaces any of them."""
    return {"event": "grpo_step", "step": n, "generated_tokens_this_step": 100, "step_ms": 1000.0,
            "rollout_ms": 400.0, "reference_ms": 100.0, "update_ms": 450.0, "weight_sync_ms": 50.0,
            "reward/correctness": 0.5, "reward/format": 0.5, "kl_mean": 0.0, "entropy_mean": 0.3,
            "finished_frac": 1.0, "len_mean": 100.0, "len_p10": 50.0, "len_p50": 100.0, "len_p90": 150.0, **over}


def run_folder(path: Path, events: list[dict], lr: float = 1e-4, temperature: float = 1.0, seed: int = 0,
               micro_batch_tokens: int = 4096, rewards: str = '["correctness", "format"]') -> Path:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(
        f'[data]\nprompts_per_step = 2\nrewards = {rewards}\nreward_weights = [1.0, 0.1]\n'
        f'[rollout]\ngroup_size = 4\ntemperature = {temperature}\n'
        f'[optim]\nlr = {lr}\nmicro_batch_size = 8\nmicro_batch_tokens = {micro_batch_tokens}\n'
        f'[train]\nseed = {seed}\n')
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def items(path: Path, correct: dict[str, bool]) -> None:
    """A battery's per-item file for math500: the fields evals.battery_records.ItemRecord reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "prompt_sha256": "", "question": "", "completion": "",
                                        "completion_tokens": 1, "finish_reason": "stop", "correct": c,
                                        "extracted": None, "reason": ""}) + "\n" for i, c in correct.items()))


SUMMARY = {"task": "gsm8k", "split": "test", "n_examples": 200,
           "greedy_pass1": {"n": 200, "base": 0.25, "trained": 0.30, "delta": 0.05, "ci_low": 0.01, "ci_high": 0.09,
                            "confidence": 0.95},
           "greedy_strict_pass1": None}


def recipe_folder(results: Path) -> Path:
    """Three recipe runs (and a folder that is not one): lr 1e-4 T 1 seed 0 with a resumed step, a battery and a
    summary; lr 1e-4 T 0.7 seed 1; lr 5e-5 T 1 seed 0."""
    folder = results / "real"
    a = run_folder(folder / "recipe-a", [step(0, generated_tokens_this_step=1000, step_ms=2000.0),
                                         step(1, generated_tokens_this_step=999),
                                         step(1, generated_tokens_this_step=1200, step_ms=3000.0),  # resumed: kept
                                         step(2, generated_tokens_this_step=1300, step_ms=4000.0)])
    write_json(a / "eval" / "summary.json", SUMMARY)
    # paired by id, not by line: the base a, b, c, d = 1, 0, 0, 0; the run's 1, 1, 0, 0 in another order
    items(a / "battery" / "items" / "math500.jsonl", {"d": False, "c": False, "b": True, "a": True})
    run_folder(folder / "recipe-b", [step(0)], temperature=0.7, seed=1)
    run_folder(folder / "recipe-c", [step(0)], lr=5e-5, micro_batch_tokens=0)
    run_folder(folder / "collapse-x", [step(0)])
    items(results / "base" / "generate" / "items" / "math500.jsonl", {"a": True, "b": False, "c": False, "d": False})
    return folder


def test_recipe_runs_rows_by_lr_then_temperature_then_seed_with_hand_summed_work(tmp_path):
    recipe_folder(tmp_path / "results")
    text = page(tmp_path, '[[page]]\nsection = "recipe_runs"\nfolder = "real"\nbase_battery = "base"\n')
    rows = [line for line in text.splitlines() if line.startswith("| recipe-")]
    assert [r.split(" | ")[0] for r in rows] == ["| recipe-c", "| recipe-b", "| recipe-a"]
    assert "MATH-500 after training (paired vs base 25.0%)" in text and "GSM8K test (200) lenient" in text
    # 3 steps x 2 prompts x 4 samples = 24 sequences; tokens 1,000 + 1,200 + 1,300; 2 + 3 + 4 s of step_ms
    # MATH-500: differences 0, 1, 0, 0 -> +25.0; a resample's mean is 0 with p = 0.75^4 = 0.32 (> 2.5%) and 1 only
    # with p = 0.25^4 = 0.004 (< 2.5%), while P(<= 0.5) = 0.95: the 95% interval is 0 to 0.75
    assert rows[2] == ("| recipe-a | 1e-4 | 1 | 3 | 24 | 3,500 | 9 | 25.0% -> 30.0% (+5.0, 95% CI +1.0 to +9.0) | "
                       "not evaluated | 50.0% (+25.0, 95% CI +0.0 to +75.0) |")
    assert rows[1].startswith("| recipe-b | 1e-4 | 0.7 | 1 | 8 | 100 | 1 | not evaluated | not evaluated | not kept")
    assert rows[0].startswith("| recipe-c | 5e-5 | 1 |")
    assert "collapse-x" not in text and "`results/base`, paired bootstrap" in text


def test_recipe_curves_first_and_last_steps_and_the_figure(tmp_path):
    """8 steps: correctness 0.0..0.7 -> first 6 mean 0.25, last 6 mean 0.45; KL 0.01 x step -> last 5 (steps 3-7)
    0.05; entropy 0.5 - 0.04 x step -> last 5 0.30, first 6 0.40; finished 1, 1, 1, 0.9, 0.9 over the last 5 -> 0.96."""
    events = [step(i, **{"reward/correctness": i / 10, "kl_mean": i / 100, "entropy_mean": 0.5 - 0.04 * i,
                         "finished_frac": 1.0 if i < 6 else 0.9}) for i in range(8)]
    events += [{"event": "heldout_curve", "step": 0, "greedy_pass1": 0.2},
               {"event": "heldout_curve", "step": 5, "greedy_pass1": 0.25},
               {"event": "heldout_curve", "step": 5, "greedy_pass1": 0.3},   # step 5 measured again on resume
               {"event": "heldout_eval", "weights_version": 8, "greedy_pass1": 0.9}]   # the end's set: not a point
    run_folder(tmp_path / "results" / "real" / "recipe-a", events)
    text = page(tmp_path, '[[page]]\nsection = "recipe_curves"\nfolder = "real"\n')
    assert "| recipe-a | 0.25 -> 0.45 | 0.05 | 0.30 (from 0.40) | 0.96 |" in text
    assert held_out_points(read_run(tmp_path / "results" / "real" / "recipe-a")) == [(0, 20.0), (5, 30.0)]
    name = "grpo_recipe_curves-real.png"
    assert f"(figures/{name})" in text and (tmp_path / "docs" / "figures" / name).stat().st_size > 20_000


def test_a_folder_without_recipe_runs_says_so(tmp_path):
    (tmp_path / "results" / "real").mkdir(parents=True)
    text = page(tmp_path, '[[page]]\nsection = "real_steps"\nfolder = "real"\n')
    assert "Not measured yet: no recipe-* run folder in `results/real`." in text


def test_collapse_side_by_side_at_steps_0_1_2_and_the_last(tmp_path):
    shipped = [step(0, len_mean=242.05, len_p10=94.7, len_p50=238.0, len_p90=390.8),
               step(1, len_mean=26.24, len_p10=4.0, len_p50=6.0, len_p90=50.1, **{"reward/correctness": 0.027,
                                                                                 "reward/format": 0.785}),
               step(2, len_mean=5.4, len_p10=4.0, len_p50=5.0, len_p90=7.0),
               step(3, len_mean=4.2, kl_mean=1.9988)]
    gated = [{k: v for k, v in step(i, len_mean=284.1, len_p10=168.2, len_p50=272.0, len_p90=416.0, kl_mean=0.031,
                                    **{"reward/correctness": 0.18}).items() if k != "reward/format"}
             | {"reward/format_gated": 0.0} for i in range(3)]
    run_folder(tmp_path / "results" / "s", shipped)
    run_folder(tmp_path / "results" / "g", gated, rewards='["correctness", "format_gated"]')
    text = page(tmp_path, '[[page]]\nsection = "collapse"\nshipped = "s"\ndefended = "g"\n')
    assert "| 1 | 26 (4/6/50) | 0.027 / 0.785 | 284 (168/272/416) | 0.180 / 0.000 |" in text
    assert "| 0 | 242 (95/238/391) | 0.500 / 0.500 |" in text and "| 2 | 5.4 (4/5/7) |" in text
    assert "| 3 | 4.2 (50/100/150) | 0.500 / 0.500 | — | — |" in text  # the defended run stopped at step 2
    assert "KL to the start at the last step: shipped 2.00 (step 3); defended 0.03 (step 2)." in text
    assert "(reward 1 x correctness + 0.1 x format_gated)" in text
    # the figure is named after both runs: the first as a slug, the other hashed
    assert (tmp_path / "docs" / "figures" / f"grpo_collapse-s-{hashlib.sha256(b'g').hexdigest()[:6]}.png").is_file()


def test_real_steps_medians_micro_batches_and_the_shared_gpu_note(tmp_path):
    folder = tmp_path / "results" / "real"
    a = run_folder(folder / "recipe-a", [step(0, step_ms=1000.0, update_ms=300.0), step(1, step_ms=3000.0),
                                         step(2, step_ms=2000.0, update_ms=600.0)])
    run_folder(folder / "recipe-b", [step(0)], lr=2e-4, micro_batch_tokens=0)
    text = page(tmp_path, '[[page]]\nsection = "real_steps"\nfolder = "real"\n')
    assert "| recipe-a | 3 | 2,000 | 400 | 100 | 450 | 50 | passes of <= 4,096 tokens |" in text
    assert "| recipe-b | 1 | 1,000 | 400 | 100 | 450 | 50 | 8 sequences a pass |" in text
    assert "shared its GPU" not in text  # no provenance says so
    write_json(a / "provenance.json", {"git_sha": "x", "shared_gpu_with": ["recipe-b"]})
    text = page(tmp_path, '[[page]]\nsection = "real_steps"\nfolder = "real"\n')
    assert "recipe-a shared its GPU with recipe-b (its provenance.json)" in text


def test_the_committed_battery_pairing_gives_the_value_the_readme_quotes():
    """results/h200/grpo/qwen2.5-coder-0.5b-gsm8k/README.md: lr 1e-4's MATH-500 '10.2% (+0.6, -2.4 to +3.6)'."""
    runs = REPO / "results" / "h200" / "grpo" / "qwen2.5-coder-0.5b-gsm8k"
    base = base_items(REPO / "results" / "h200" / "models" / "qwen2.5-coder-0.5b-instruct-q4km", "math500")
    d = paired_battery(read_run(runs / "recipe-lr1e-4-s0"), base)
    assert (d.n, f"{100 * d.trained:.1f}", f"{100 * d.delta:+.1f}", f"{100 * d.ci_low:+.1f}",
            f"{100 * d.ci_high:+.1f}") == (500, "10.2", "+0.6", "-2.4", "+3.6")
