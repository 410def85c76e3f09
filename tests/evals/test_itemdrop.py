"""Dropping a battery task's texts keeps every verdict and refuses when the summary would not be recomputed."""
from __future__ import annotations

import hashlib
from dataclasses import asdict, replace

import pytest

from scalelab.core.jsonio import read_bytes, read_json, write_json
from scalelab.evals.battery_records import BatteryFolder, GenSummary, ItemRecord, read_items, write_items
from scalelab.evals.itemdrop import drop_item_texts, main


def _item(k: int, correct: bool, tokens: int, finish: str = "stop") -> ItemRecord:
    return ItemRecord(f"q{k}", f"{k:064x}", f"What is {k} + {k}?", f"The answer is \\boxed{{{2 * k}}}.", tokens,
                      finish, correct, str(2 * k), "by boxed")


def _folder(tmp_path, items, **summary_changes):
    bf = BatteryFolder(tmp_path / "battery")
    write_items(bf, "math500", items)
    n = len(items)
    summary = GenSummary("math500", "test", n, sum(i.correct for i in items), None, None,
                         sum(i.completion_tokens for i in items) / n,
                         sum(i.finish_reason == "length" for i in items) / n, 64, 2.0, 10.0, {}, "abc")
    write_json(bf.summary("math500"), {**asdict(replace(summary, **summary_changes)), "provenance": {}})
    return bf


def test_texts_go_verdicts_stay_and_the_drop_is_recorded(tmp_path, capsys):
    items = [_item(1, True, 10), _item(2, False, 64, "length"), _item(3, True, 7)]
    bf = _folder(tmp_path, items)
    before = hashlib.sha256(read_bytes(bf.items("math500"))).hexdigest()
    assert main([str(bf.root), "math500"]) == 0 and "3 of 3 texts dropped" in capsys.readouterr().out
    kept = read_items(bf, "math500")
    assert [(i.id, i.correct, i.completion_tokens, i.finish_reason, i.extracted) for i in kept] == \
        [("q1", True, 10, "stop", "2"), ("q2", False, 64, "length", "4"), ("q3", True, 7, "stop", "6")]
    assert all(i.question == "" and i.completion == "" for i in kept)
    assert (bf.root / "items" / "math500.jsonl.xz").is_file()
    assert not (bf.root / "items" / "math500.jsonl.gz").exists()        # the packed file supersedes the old form
    log = read_json(bf.root / "items" / "texts.json")
    assert log["dropped"] == [{"task": "math500", "rows": 3, "texts": 3, "sha256": before}]
    with pytest.raises(ValueError, match="dropped before"):
        drop_item_texts(bf.root, "math500")


def test_a_summary_the_items_do_not_give_back_stops_the_drop(tmp_path):
    items = [_item(1, True, 10), _item(2, False, 20)]
    bf = _folder(tmp_path, items, correct=2)                      # recorded 2 correct; the items hold 1
    before = read_bytes(bf.items("math500"))
    with pytest.raises(ValueError, match="correct: recorded 2, items give 1"):
        drop_item_texts(bf.root, "math500")
    assert read_bytes(bf.items("math500")) == before and not (bf.root / "items" / "texts.json").exists()
    shifted = _folder(tmp_path / "b", items, mean_completion_tokens=15.5)
    with pytest.raises(ValueError, match="mean_completion_tokens"):
        drop_item_texts(shifted.root, "math500")


def test_a_missing_task_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="items/gsm8k.jsonl"):
        drop_item_texts(tmp_path, "gsm8k")
