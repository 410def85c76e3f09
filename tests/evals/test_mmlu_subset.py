"""The fixed stratified MMLU subset: quotas by hand, choice by item content only, the real 14,042, and pairing a
subset run with a full-MMLU base record (McNemar's exact p from hand-counted discordant items)."""
from __future__ import annotations

import json
import random

import pytest

from scalelab.evals.localdata import read_mmlu
from scalelab.evals.mmlu_subset import SUBSET_RECORD, allocate, cached_subset, choose, read_test_rows, restrict


@pytest.mark.parametrize("sizes, n, want", [
    ({"a": 10, "b": 6, "c": 4}, 10, {"a": 5, "b": 3, "c": 2}),        # exact: 5, 3, 2
    ({"a": 7, "b": 2, "c": 1}, 5, {"a": 4, "b": 1, "c": 0}),          # 3.5, 1.0, 0.5: the tie goes to "a"
    ({"x": 3, "y": 3, "z": 3}, 4, {"x": 2, "y": 1, "z": 1}),          # 1.33 each: one extra, to "x"
    ({"a": 1, "b": 99}, 100, {"a": 1, "b": 99}),                      # n = all
])
def test_allocate_largest_remainder(sizes, n, want):
    assert allocate(sizes, n) == want


def test_allocate_rejects_bad_sizes():
    with pytest.raises(ValueError, match="1..10"):
        allocate({"a": 10}, 11)


def _rows(subject, k):
    return [{"question": f"{subject} q{i}", "subject": subject, "choices": ["a", "b", "c", "d"], "answer": i % 4}
            for i in range(k)]


def test_choice_depends_on_item_content_not_order():
    rows = {"s": _rows("s", 40), "t": _rows("t", 20)}
    kept = choose(rows, 15)
    assert {s: len(i) for s, i in kept.items()} == {"s": 10, "t": 5}
    questions = {s: {rows[s][i]["question"] for i in idx} for s, idx in kept.items()}
    shuffled = {s: random.Random(1).sample(r, len(r)) for s, r in rows.items()}
    again = choose(shuffled, 15)
    assert {s: {shuffled[s][i]["question"] for i in idx} for s, idx in again.items()} == questions


def test_real_mmlu_subset_of_2000(shared_data, tmp_path):
    rows = read_test_rows(shared_data / "mmlu")
    sizes = {s: len(r) for s, r in rows.items()}
    assert len(sizes) == 57 and sum(sizes.values()) == 14042
    data_dir = cached_subset(shared_data, 2000, tmp_path)
    record = json.loads((data_dir / "mmlu" / SUBSET_RECORD).read_text())
    per = record["per_subject"]
    assert sum(per.values()) == record["n"] == 2000 and record["n_full"] == 14042
    # stratified: each subject within one item of its exact share; shares as in full MMLU
    assert all(abs(per[s] - 2000 * sizes[s] / 14042) < 1 for s in sizes)
    assert per["professional_law"] == 218 and per["high_school_psychology"] == 78     # 1534 and 545 of 14,042
    # the local lm-eval tasks read the folder like the full one: dev unchanged, test = the kept rows
    sub = read_mmlu(data_dir / "mmlu")
    assert sum(len(v) for k, v in sub.items() if k.endswith("_test")) == 2000
    assert sum(len(v) for k, v in sub.items() if k.endswith("_dev")) == 285
    for s, idx in record["full_index"].items():
        assert [r["question"] for r in sub[f"{s}_test"]] == [rows[s][i]["question"] for i in idx]
    assert cached_subset(shared_data, 2000, tmp_path) == data_dir  # built once, then reused
    assert choose(rows, 2000) == record["full_index"]              # same items on every call


def test_full_record_restricted_and_paired_with_mcnemar():
    from scalelab.dpo.battery_stats import comparison_row
    record = {"full_index": {"anatomy": [1, 4], "virology": [0, 2, 3, 5, 6, 7, 8]}}
    full = {f"mmlu_{s}/{i}": float(i) for s, n in (("anatomy", 6), ("virology", 9)) for i in range(n)}
    assert restrict(full, record) == {"mmlu_anatomy/0": 1.0, "mmlu_anatomy/1": 4.0, "mmlu_virology/0": 0.0,
                                      "mmlu_virology/1": 2.0, "mmlu_virology/2": 3.0, "mmlu_virology/3": 5.0,
                                      "mmlu_virology/4": 6.0, "mmlu_virology/5": 7.0, "mmlu_virology/6": 8.0}
    # base (a full run) right on full rows anatomy/1 and virology/8 = subset rows anatomy/0 and virology/6;
    # tuned (a subset run) wrong on anatomy/0 (base-only) and virology/0 (neither): both-right virology/6,
    # tuned-only the other 6
    base_full = {k: 0.0 for k in full} | {"mmlu_anatomy/1": 1.0, "mmlu_virology/8": 1.0}
    base = restrict(base_full, record)
    assert [k for k, v in base.items() if v] == ["mmlu_anatomy/0", "mmlu_virology/6"]
    tuned = {k: 1.0 for k in base} | {"mmlu_anatomy/0": 0.0, "mmlu_virology/0": 0.0}
    row = comparison_row("mmlu", "mmlu", "acc", base, tuned, binary=True, n_resamples=200, seed=0)
    assert (row["tuned_only"], row["base_only"], row["both_correct"], row["neither_correct"]) == (6, 1, 1, 1)
    # exact McNemar: 2 P[X <= 1], X ~ Bin(7, 1/2) = 2 (1 + 7) / 128
    assert row["mcnemar_p"] == pytest.approx(16 / 128)
    assert row["delta"] == pytest.approx(5 / 9)
