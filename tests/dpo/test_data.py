"""Preference data: HH-RLHF dialogue splitting, conversational rows, malformed rows, splits, the real HH file."""
from __future__ import annotations

import gzip
import json

import pytest

from scalelab.dpo.data import (MalformedRow, PreferencePair, hh_pair, load_pairs, split_by_prompt,
                               split_dialogue, subsample, write_pairs_jsonl)
from tests.dpo.conftest import arithmetic_pairs

U = lambda text: {"role": "user", "content": text}        # noqa: E731
A = lambda text: {"role": "assistant", "content": text}   # noqa: E731


def test_split_dialogue_exact_turns():
    text = "\n\nHuman: Hi there\n\nAssistant: Hello!  \n\nHuman: What is 2+2?\n\nAssistant: It is 4."
    assert split_dialogue(text) == [U("Hi there"), A("Hello!"), U("What is 2+2?"), A("It is 4.")]


def test_split_dialogue_keeps_inner_newlines_and_colons():
    text = "\n\nHuman: list:\n1. a\n2. b\n\nAssistant: Sure:\n\n- a\n- b"
    assert split_dialogue(text) == [U("list:\n1. a\n2. b"), A("Sure:\n\n- a\n- b")]


def test_hh_pair_shared_prompt_and_final_responses():
    prefix = "\n\nHuman: Can you help?\n\nAssistant: Yes.\n\nHuman: How do I bake bread?"
    row = {"chosen": prefix + "\n\nAssistant: Mix flour, water and yeast, then bake.",
           "rejected": prefix + "\n\nAssistant: No idea."}
    pair = hh_pair(row, "hh-rlhf", "x:1")
    assert pair.prompt == [U("Can you help?"), A("Yes."), U("How do I bake bread?")]
    assert pair.chosen == [A("Mix flour, water and yeast, then bake.")]
    assert pair.rejected == [A("No idea.")]


@pytest.mark.parametrize("row, reason", [
    ({"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: DIFFERENT\n\nAssistant: c"},
     "differ before their final turn (turn 1)"),
    ({"chosen": "\n\nHuman: a\n\nAssistant: b\n\nHuman: c", "rejected": "\n\nHuman: a\n\nAssistant: b"},
     "'chosen' has no final assistant turn"),
    ({"chosen": "\n\nHuman: a\n\nAssistant: ", "rejected": "\n\nHuman: a\n\nAssistant: b"},
     "'chosen' has an empty final assistant response"),
    ({"chosen": "\n\nHuman: a\n\nAssistant: b"}, "field 'rejected' is missing"),
    ({"chosen": "preamble\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: a\n\nAssistant: c"},
     "text before the first"),
])
def test_hh_malformed_reasons(row, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        hh_pair(row, "hh-rlhf", "x")


def _write_gz(path, lines):
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def test_malformed_rows_name_file_and_line(tmp_path):
    good = json.dumps({"chosen": "\n\nHuman: q\n\nAssistant: yes", "rejected": "\n\nHuman: q\n\nAssistant: no"})
    differ = json.dumps({"chosen": "\n\nHuman: q\n\nAssistant: yes", "rejected": "\n\nHuman: Q2\n\nAssistant: no"})
    no_final = json.dumps({"chosen": "\n\nHuman: q", "rejected": "\n\nHuman: q\n\nAssistant: no"})
    path = tmp_path / "hh.jsonl.gz"
    _write_gz(path, [good, differ, good, "{not json", no_final, good])
    with pytest.raises(MalformedRow, match=rf"^{path}:2: chosen and rejected dialogues differ"):
        load_pairs("hh-rlhf", str(path))
    res = load_pairs("hh-rlhf", str(path), strict=False)
    assert len(res.pairs) == 3 and res.rows_read == 6
    assert [where for where, _ in res.skipped] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert "invalid JSON" in res.skipped[1][1] and "no final assistant turn" in res.skipped[2][1]
    assert [p.id for p in res.pairs] == ["hh.jsonl.gz:1", "hh.jsonl.gz:3", "hh.jsonl.gz:6"]


def test_real_hh_rlhf_file(shared_data):
    path = shared_data / "hh-rlhf" / "harmless-base_test.jsonl.gz"
    res = load_pairs("hh-rlhf", str(path), strict=False)
    assert res.rows_read == 2312
    # 4 rows whose chosen reply is empty, 5 whose chosen and rejected dialogues differ before the last turn
    assert len(res.pairs) == 2303
    assert [int(w.rsplit(":", 1)[1]) for w, _ in res.skipped] == [87, 517, 926, 1104, 1255, 1689, 1951, 1953, 2037]
    first = res.pairs[0]
    assert first.prompt[0] == U("what are some pranks with a pen i can do?") and len(first.prompt) == 5
    assert first.chosen[0]["content"].startswith("No, sorry!  All of these involve a pen")
    assert all(p.prompt[-1]["role"] == "user" for p in res.pairs[:200])
    with pytest.raises(MalformedRow, match=r"harmless-base_test\.jsonl\.gz:87: 'chosen' has an empty"):
        load_pairs("hh-rlhf", str(path))


def _uf_row(i):
    prompt = f"Question {i}?"
    return {"prompt": prompt, "prompt_id": f"p{i}", "score_chosen": 8.0, "score_rejected": 3.0,
            "chosen": [U(prompt), A(f"good {i}")], "rejected": [U(prompt), A(f"bad {i}")]}


def test_ultrafeedback_jsonl_and_parquet_same_pairs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [_uf_row(i) for i in range(3)]
    (tmp_path / "uf.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "uf.parquet")
    from_jsonl = load_pairs("ultrafeedback", str(tmp_path / "uf.jsonl")).pairs
    from_parquet = load_pairs("ultrafeedback", str(tmp_path / "uf.parquet")).pairs
    assert from_jsonl == from_parquet
    assert from_jsonl[1] == PreferencePair([U("Question 1?")], [A("good 1")], [A("bad 1")], "ultrafeedback", "p1")


def test_ultrafeedback_prefix_mismatch_is_malformed(tmp_path):
    row = _uf_row(0)
    row["rejected"] = [U("another question"), A("bad")]
    (tmp_path / "uf.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(MalformedRow, match=r"uf\.jsonl:1: chosen and rejected conversations differ"):
        load_pairs("ultrafeedback", str(tmp_path / "uf.jsonl"))


def test_pairs_jsonl_round_trip(tmp_path):
    pairs = arithmetic_pairs(5)
    path = write_pairs_jsonl(tmp_path / "p.jsonl", pairs)
    assert load_pairs("pairs", str(path)).pairs == pairs


def test_split_by_prompt_keeps_prompts_whole_and_is_seeded():
    base = arithmetic_pairs(10)
    # two pairs per prompt: same prompt, different rejected answer
    pairs = base + [PreferencePair(p.prompt, p.chosen, [A("wrong")], "test", p.id + "b") for p in base]
    train, val = split_by_prompt(pairs, 0.3, seed=1)
    assert len(val) == 6 and len(train) == 14  # 3 of 10 prompts, 2 pairs each
    assert not {p.prompt_key for p in train} & {p.prompt_key for p in val}
    assert split_by_prompt(pairs, 0.3, seed=1) == (train, val)
    assert split_by_prompt(pairs, 0.3, seed=2)[1] != val


def test_subsample_keeps_order_and_size():
    pairs = arithmetic_pairs(10)
    sub = subsample(pairs, 4, seed=0)
    assert len(sub) == 4 and [pairs.index(p) for p in sub] == sorted(pairs.index(p) for p in sub)
    assert subsample(pairs, 0, seed=0) == pairs
