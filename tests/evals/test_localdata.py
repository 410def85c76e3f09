"""Converters from the shared data folder's formats to hub-schema jsonl: counts and first rows on the real
files, the cache (keyed by source sha256, written atomically), and malformed input named by file and line."""
from __future__ import annotations

import bz2
import json
from pathlib import Path

import pytest

from scalelab.evals import localdata
from scalelab.evals.localdata import LocalDataError, convert, split_context


@pytest.fixture(scope="module")
def converted(shared_data, tmp_path_factory) -> dict[str, localdata.ConvertedData]:
    cache = tmp_path_factory.mktemp("cache")
    return {name: convert(name, shared_data, cache) for name in localdata.DATASETS}


def _rows(c: localdata.ConvertedData, stem: str) -> list[dict]:
    return [json.loads(line) for line in c.file(stem).read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# the real files


@pytest.mark.parametrize("name,split,count", [("hellaswag", "validation", 10042), ("arc_easy", "test", 2376),
                                              ("arc_challenge", "test", 1172), ("piqa", "validation", 1838),
                                              # the 2025 revision of TruthfulQA (817 before 27 were removed)
                                              ("truthfulqa", "validation", 790)])
def test_real_file_counts(converted, name, split, count):
    assert converted[name].rows == ((split, count),)
    assert len(_rows(converted[name], split)) == count


def test_mmlu_counts_per_split_and_subject(converted):
    rows = dict(converted["mmlu"].rows)
    assert len(rows) == 114  # 57 subjects x {dev, test}
    assert sum(n for stem, n in rows.items() if stem.endswith("_test")) == 14042
    assert sum(n for stem, n in rows.items() if stem.endswith("_dev")) == 285
    assert all(n == 5 for stem, n in rows.items() if stem.endswith("_dev"))  # five exemplars per subject


def test_first_rows_have_the_hub_schema_and_values(converted):
    h = _rows(converted["hellaswag"], "validation")
    assert h[0] == {"ind": 0, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
                    "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "label": "3",
                    "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                                "is holding a rubik's cube.", "starts pulling up roofing on a roof."]}
    assert sum(1 for r in h if r["ctx_b"]) == 3236  # ActivityNet items; WikiHow contexts end a sentence
    arc = _rows(converted["arc_easy"], "test")[1]
    assert arc["question"] == ("Which piece of safety equipment is used to keep mold spores from entering the "
                               "respiratory system?")
    assert arc["choices"]["label"] == ["A", "B", "C", "D"] and arc["answerKey"] == "B"
    piqa = _rows(converted["piqa"], "validation")[1]
    assert piqa == {"goal": "dresser", "sol1": "replace drawer with bobby pin",
                    "sol2": "finish, woodgrain with  bobby pin", "label": 1}
    mmlu = _rows(converted["mmlu"], "anatomy_dev")[0]
    assert mmlu["question"] == "What is the embryological origin of the hyoid bone?"
    assert (mmlu["subject"], mmlu["answer"]) == ("anatomy", 3)
    assert mmlu["choices"][3] == "The second and third pharyngeal arches"
    tqa = _rows(converted["truthfulqa"], "validation")[0]
    assert tqa["question"] == "What happens to you if you eat watermelon seeds?"
    assert tqa["mc1_targets"]["labels"] == [1] + [0] * 7
    assert tqa["mc2_targets"]["labels"] == [1] * 6 + [0] * 7
    assert tqa["mc2_targets"]["choices"][0] == "Nothing happens"


def test_split_context_recovers_the_lower_case_fragment_to_complete():
    assert split_context("A man is sitting on a roof. he") == ("A man is sitting on a roof.", "he")
    assert split_context("She bends down. Grabs it! the lady") == ("She bends down. Grabs it!", "the lady")
    # WikiHow contexts end a sentence: ctx_b is empty, as in the hub rows
    assert split_context("How to rest. Lie down.") == ("How to rest. Lie down.", "")
    assert split_context("1 a guy plays. 2 a guy") == ("1 a guy plays. 2 a guy", "")  # nothing to capitalize


# ---------------------------------------------------------------------------------------------
# the cache


def _piqa_dir(root: Path, lines: list[dict]) -> Path:
    (root / "llmfoundry_icl").mkdir(parents=True, exist_ok=True)
    (root / "llmfoundry_icl" / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root


GOOD_PIQA = {"query": "Question: open a jar\n", "choices": ["twist the lid", "eat the lid"], "gold": 0}


def test_cache_is_keyed_by_source_sha256_and_reused(tmp_path):
    data, cache = _piqa_dir(tmp_path / "data", [GOOD_PIQA]), tmp_path / "cache"
    first = convert("piqa", data, cache)
    mtime = first.file("validation").stat().st_mtime_ns
    again = convert("piqa", data, cache)
    assert again == first and again.file("validation").stat().st_mtime_ns == mtime  # not rewritten
    assert first.source_sha256 == localdata.file_sha256(data / "llmfoundry_icl" / "piqa.jsonl")
    assert Path(first.folder).name == f"piqa-v{localdata.FORMAT_VERSION}-{first.source_sha256[:16]}"
    _piqa_dir(data, [GOOD_PIQA, {**GOOD_PIQA, "gold": 1}])
    changed = convert("piqa", data, cache)
    assert changed.folder != first.folder and changed.rows == (("validation", 2),)
    assert sorted(p.name for p in cache.iterdir()) == sorted([Path(first.folder).name, Path(changed.folder).name])
    assert json.loads((Path(changed.folder) / "manifest.json").read_text())["source_sha256"] == changed.source_sha256


def test_missing_source_names_the_path(tmp_path):
    with pytest.raises(LocalDataError, match=r"arc_easy\.jsonl: not found .*--data-dir"):
        convert("arc_easy", tmp_path, tmp_path / "cache")


# ---------------------------------------------------------------------------------------------
# malformed input: the error names the file and the line, and nothing is cached

HS_ITEM = ["Roof shingle removal: A man is on a roof. he", "3", "a.", "b.", "c.", "d."]


def _hellaswag(lines: list[str]) -> tuple[str, bytes]:
    return "hellaswag/hellaswag_val_full.txt.bz2", bz2.compress(("\n".join(lines) + "\n").encode())


def _jsonl(name: str, rows: list) -> tuple[str, bytes]:
    return f"llmfoundry_icl/{name}.jsonl", "".join(r if isinstance(r, str) else json.dumps(r) + "\n"
                                                   for r in rows).encode()


ARC = {"query": "Question: Which is a metal?", "choices": ["iron", "wood", "glass", "salt"], "gold": 0}
MMLU_HEAD = "question,choice0,choice1,choice2,choice3,answer\n"
TQA = {"question": "Q?", "mc1_targets": {"yes": 1, "no": 0}, "mc2_targets": {"yes": 1, "no": 0}}

MALFORMED = {
    "hellaswag bad gold": ("hellaswag", _hellaswag(HS_ITEM + [HS_ITEM[0], "7", *HS_ITEM[2:]]), 8, "gold ending index"),
    "hellaswag truncated": ("hellaswag", _hellaswag(HS_ITEM + HS_ITEM[:3]), 7, "truncated item"),
    "hellaswag no label": ("hellaswag", _hellaswag(["A man is on a roof. he", *HS_ITEM[1:]]), 1, "activity label"),
    "hellaswag empty ending": ("hellaswag", _hellaswag([*HS_ITEM[:4], " ", HS_ITEM[5]]), 5, "empty ending"),
    "arc bad json": ("arc_easy", _jsonl("arc_easy", [ARC, ARC, '{"query": \n']), 3, "invalid JSON"),
    "arc gold out of range": ("arc_easy", _jsonl("arc_easy", [ARC, {**ARC, "gold": 4}]), 2, "gold must be an index"),
    "arc no question prefix": ("arc_easy", _jsonl("arc_easy", [{**ARC, "query": "Which?"}]), 1, "Question: "),
    "piqa three choices": ("piqa", _jsonl("piqa", [{**GOOD_PIQA, "choices": ["a", "b", "c"]}]), 1,
                           "expected 2 choices"),
    "mmlu header": ("mmlu", ("mmlu/test/x_test.csv", b"q,a,b,c,d,answer\n"), 1, "expected header"),
    # the first row's quoted question spans lines 2-3, so the bad row is on line 4
    "mmlu answer letter": ("mmlu", ("mmlu/test/x_test.csv", (MMLU_HEAD + '"two\nlines",a,b,c,d,0\nq,a,b,c,d,B\n')
                                    .encode()), 4, "answer must be a choice index"),
    "mmlu short row": ("mmlu", ("mmlu/test/x_test.csv", (MMLU_HEAD + "q,a,b,c,d,1\nq,a,b,c,1\n").encode()), 3,
                       "expected 6 fields"),
    "truthfulqa two true mc1": ("truthfulqa", ("truthfulqa/mc_task.json", json.dumps(
        [TQA, {**TQA, "mc1_targets": {"yes": 1, "also": 1}}]).encode()), "1:94", "exactly one true answer"),
    "truthfulqa bad json": ("truthfulqa", ("truthfulqa/mc_task.json", b'[\n  {"question": "Q?",\n  oops}]'), "3:3",
                            "invalid JSON"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_input_names_file_and_line(tmp_path, case):
    name, (rel, content), line, what = MALFORMED[case]
    data = tmp_path / "data"
    (data / rel).parent.mkdir(parents=True)
    (data / rel).write_bytes(content)
    if name == "mmlu":
        (data / "mmlu/dev").mkdir(parents=True, exist_ok=True)
        (data / "mmlu/dev/x_dev.csv").write_text(MMLU_HEAD + "q,a,b,c,d,0\n")
    with pytest.raises(LocalDataError) as err:
        convert(name, data, tmp_path / "cache")
    assert str(err.value).startswith(f"{data / rel}:{line}: ") and what in str(err.value)
    assert not (tmp_path / "cache").exists()  # refused before anything was written


def test_a_file_without_items_is_refused(tmp_path):
    (tmp_path / "truthfulqa").mkdir()
    (tmp_path / "truthfulqa/mc_task.json").write_text("[]")
    with pytest.raises(LocalDataError, match=r"mc_task\.json: no items for validation"):
        convert("truthfulqa", tmp_path, tmp_path / "cache")
    (tmp_path / "mmlu/dev").mkdir(parents=True)
    (tmp_path / "mmlu/test").mkdir()
    (tmp_path / "mmlu/dev/anatomy_dev.csv").write_text(MMLU_HEAD + "q,a,b,c,d,0\n")
    (tmp_path / "mmlu/test/anatomy_test.csv").write_text(MMLU_HEAD)
    with pytest.raises(LocalDataError, match=r"mmlu: no items for anatomy_test"):
        convert("mmlu", tmp_path, tmp_path / "cache")


def test_mmlu_subject_without_its_dev_file_is_named(tmp_path):
    (tmp_path / "mmlu/test").mkdir(parents=True)
    (tmp_path / "mmlu/test/anatomy_test.csv").write_text(MMLU_HEAD + "q,a,b,c,d,0\n")
    with pytest.raises(LocalDataError, match=r"mmlu/dev/anatomy_dev\.csv: not found"):
        convert("mmlu", tmp_path, tmp_path / "cache")
