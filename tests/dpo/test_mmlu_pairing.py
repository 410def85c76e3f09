"""MMLU base vs tuned on different item sets: the full side restricted to the subset's items (McNemar and the
paired difference by hand on exactly those), the same subset, a limit inside a full run, and the refusals."""
from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from scalelab.dpo import battery as bat
from scalelab.dpo.config import load_dpo_config
from scalelab.dpo.mmlu_pairing import MmluPairingError, pair_mmlu
from tests.dpo.test_battery import make_run

# full file rows: anatomy 0..5, virology 0..8 (15 items); the subset keeps anatomy 0, 2, 4, 5 and virology
# 1, 2, 3, 6, 7, 8 (10 items), keyed by their row in the subset file
SUBSET = {"n": 10, "n_full": 15, "full_index": {"anatomy": [0, 2, 4, 5], "virology": [1, 2, 3, 6, 7, 8]}}
FULL_KEYS = [f"mmlu_anatomy/{i}" for i in range(6)] + [f"mmlu_virology/{i}" for i in range(9)]


def base_full() -> dict[str, float]:
    """Right on full rows anatomy/2 and virology/3 among the subset's items, and on every item outside it (a
    pairing that kept those would show a higher base accuracy)."""
    kept = {"mmlu_anatomy/0", "mmlu_anatomy/2", "mmlu_anatomy/4", "mmlu_anatomy/5", "mmlu_virology/1",
            "mmlu_virology/2", "mmlu_virology/3", "mmlu_virology/6", "mmlu_virology/7", "mmlu_virology/8"}
    return {k: (1.0 if k not in kept or k in ("mmlu_anatomy/2", "mmlu_virology/3") else 0.0) for k in FULL_KEYS}


def tuned_subset() -> dict[str, float]:
    """Subset rows: anatomy/1 = full anatomy/2 and virology/2 = full virology/3 right (as the base), plus five
    more right: anatomy/0, anatomy/3, virology/0, virology/4, virology/5; wrong on anatomy/2, virology/1, /3."""
    right = {"mmlu_anatomy/0", "mmlu_anatomy/1", "mmlu_anatomy/3", "mmlu_virology/0", "mmlu_virology/2",
             "mmlu_virology/4", "mmlu_virology/5"}
    keys = [f"mmlu_anatomy/{j}" for j in range(4)] + [f"mmlu_virology/{j}" for j in range(6)]
    return {k: float(k in right) for k in keys}


def test_full_base_restricted_to_the_tuned_subset():
    p = pair_mmlu(base_full(), tuned_subset(), None, SUBSET)
    assert (p.n, p.n_base_measured, p.n_tuned_measured, p.restricted) == (10, 15, 10, "base")
    assert set(p.base) == set(p.tuned) == set(tuned_subset())
    assert [k for k, v in p.base.items() if v] == ["mmlu_anatomy/1", "mmlu_virology/2"]
    assert "10-item subset" in p.detail and "15-item run restricted" in p.detail


def test_summarize_pairs_a_full_base_record_with_a_subset_row_by_hand(tmp_path):
    cfg = load_dpo_config(None, ["battery.parts=['mmlu']", "battery.data_dir='/data'", "battery.mmlu_subset=10",
                                 "battery.mmlu_base_full=true", "battery.bootstrap_resamples=400",
                                 f"run.out_dir='{tmp_path}'", "run.name='dpo-beta0.1'"])
    plans = {"base": bat.plan(bat.base_config(cfg)), "tuned": bat.plan(cfg)}
    assert "mmlu_subset" not in plans["base"][0].spec and plans["tuned"][0].spec["mmlu_subset"] == 10

    def record(part, values, **extra):
        return {"part": "mmlu", "spec": part.spec, "scores": {"mmlu": {"metric": "acc", "binary": True,
                                                                       "values": values}}, **extra}
    records = {("base", "mmlu"): record(plans["base"][0], base_full()),
               ("tuned", "mmlu"): record(plans["tuned"][0], tuned_subset(), subset=SUBSET)}
    sides = {"base": bat.Side("base", tmp_path / "battery-base", bat.base_config(cfg)),
             "tuned": bat.Side("tuned", tmp_path / "run" / "battery" / "tuned", cfg, adapter_sha256="ab")}
    row = bat.summarize(cfg, tmp_path / "run", plans, records, sides)["comparisons"]["mmlu"]
    # the 10 paired items: both right 2, tuned only 5, base only 0, neither 3
    assert (row["n"], row["n_base_measured"], row["n_tuned_measured"]) == (10, 15, 10)
    assert (row["both_correct"], row["tuned_only"], row["base_only"], row["neither_correct"]) == (2, 5, 0, 3)
    assert row["mcnemar_p"] == pytest.approx(2 / 32)           # 2 P[X <= 0], X ~ Bin(5, 1/2)
    assert (row["base"], row["tuned"], row["delta"]) == pytest.approx((0.2, 0.7, 0.5))
    assert row["restricted"] == "base" and "10-item subset" in row["paired_on"]


def test_the_same_subset_on_both_sides_pairs_as_is():
    p = pair_mmlu(tuned_subset(), tuned_subset(), SUBSET, SUBSET)
    assert p.restricted == "" and p.n == 10


def test_a_full_tuned_run_is_restricted_to_a_subset_base():
    p = pair_mmlu(tuned_subset(), base_full(), SUBSET, None)
    assert (p.restricted, p.n, p.n_tuned_measured) == ("tuned", 10, 15)


def test_a_per_subject_limit_pairs_with_a_full_run_on_its_rows():
    limited = {k: 1.0 for k in ("mmlu_anatomy/0", "mmlu_anatomy/1", "mmlu_virology/0", "mmlu_virology/1")}
    p = pair_mmlu(base_full(), limited)
    assert p.restricted == "base" and set(p.base) == set(limited)


def test_item_sets_of_which_neither_contains_the_other_are_refused():
    other = {**SUBSET, "full_index": {"anatomy": [0, 1, 2, 3], "virology": [1, 2, 3, 6, 7, 8]}}
    with pytest.raises(MmluPairingError, match="different subsets"):
        pair_mmlu(tuned_subset(), tuned_subset(), SUBSET, other)
    limited = {k: 1.0 for k in FULL_KEYS if k.endswith(("/0", "/1"))}      # a limit run: lacks subset rows
    with pytest.raises(MmluPairingError, match=r"base \(4 items\) with tuned \(10 items\).*not a full run"):
        pair_mmlu(limited, tuned_subset(), None, SUBSET)
    with pytest.raises(MmluPairingError, match="neither item set contains the other"):
        pair_mmlu({"mmlu_anatomy/0": 1.0, "mmlu_anatomy/1": 0.0}, {"mmlu_anatomy/1": 1.0, "mmlu_anatomy/2": 0.0})


def tiny_mmlu(root: Path, rows: int = 2) -> Path:
    """data_dir/mmlu with every subject (the local lm-eval tasks read all 57): the real dev exemplars and the
    first `rows` test questions of each."""
    import shutil
    src = Path(__file__).resolve().parents[3] / "shared" / "data" / "mmlu"
    if not src.is_dir():
        pytest.skip("../shared/data/mmlu absent")
    shutil.copytree(src / "dev", root / "mmlu" / "dev")
    (root / "mmlu" / "test").mkdir()
    for path in sorted((src / "test").glob("*_test.csv")):
        with open(path, newline="", encoding="utf-8") as f:
            kept = list(csv.reader(f))[:rows + 1]            # the header and the first rows (fields may span lines)
        with open(root / "mmlu" / "test" / path.name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(kept)
    return root


@pytest.fixture
def counted(monkeypatch):
    """Every measurement as (side, part), counted."""
    counts: Counter = Counter()
    for kind, fn in list(bat.MEASURE.items()):
        def wrapped(part, side, fn=fn):
            counts[(side.name, part.name)] += 1
            return fn(part, side)
        monkeypatch.setitem(bat.MEASURE, kind, wrapped)
    return counts


def test_battery_base_in_full_then_a_subset_row_then_the_run_in_full(tiny_model_dir, tmp_path, counted,
                                                                     monkeypatch):
    """battery.mmlu_base_full: the base measures all 114 items once, the subset row pairs on its 57 (one per subject), and the
    same run measured in full afterwards reuses the base record and pairs on all 114."""
    monkeypatch.setenv("SCALELAB_CACHE", str(tmp_path / "cache"))
    data = tiny_mmlu(tmp_path / "data")
    sets = ["battery.parts=['mmlu']", f"battery.data_dir='{data}'", "battery.mmlu_fewshot=0",
            "battery.lm_eval_batch_size=8", "battery.bootstrap_resamples=200", "battery.lm_eval_request_cache=false"]
    cfg, run = make_run(tmp_path / "sweep", "dpo-beta0.1", tiny_model_dir, sets + ["battery.mmlu_subset=57",
                                                                                   "battery.mmlu_base_full=true"])
    row = bat.run_battery(cfg, run)["comparisons"]["mmlu"]
    assert (row["n"], row["n_base_measured"], row["n_tuned_measured"], row["restricted"]) == (57, 114, 57, "base")
    full = load_dpo_config(None, [*sets, f"model.name='{tiny_model_dir}'", "model.device='cpu'",
                                  "model.dtype='float32'", f"run.out_dir='{tmp_path / 'sweep'}'",
                                  "run.name='dpo-beta0.1'", "battery.mmlu_base_full=true"])
    again = bat.run_battery(full, run)["comparisons"]["mmlu"]
    assert (again["n"], again["restricted"]) == (114, "")
    assert counted == Counter({("base", "mmlu"): 1, ("tuned", "mmlu"): 2})   # the base's full record reused
