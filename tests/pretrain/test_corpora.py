"""The mixed corpus (configs/pretrain/prepare-sharegpt-corpora.toml): NLTK's zips decoded as NLTK does, Shakespeare's
XML plays as text, the `mix` source's groups and the train_only rule, and the real config prepared on the real
corpora (a small ShareGPT file in place of the packaged 125 MB one)."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from scalelab.core.config import ConfigError, load_config
from scalelab.core.readers import SourceError
from scalelab.pretrain.corpora import decode_member, parse_part, play_text
from scalelab.pretrain.prepare import PrepareConfig, prepare
from scalelab.pretrain.shards import verify_shards
from scalelab.pretrain.sources import DocumentRouter, SourceSpec, build_source

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "prepare-sharegpt-corpora.toml"
PLAY = b"""<?xml version="1.0"?><PLAY><TITLE>The Tragedy of X</TITLE><!-- a comment -->
<PERSONAE><TITLE>Dramatis Personae</TITLE><PERSONA>X, a king.</PERSONA></PERSONAE>
<ACT><TITLE>ACT I</TITLE><SCENE><TITLE>SCENE I.  A room.</TITLE><STAGEDIR>Enter X</STAGEDIR>
<SPEECH><SPEAKER>X</SPEAKER><LINE>To be, or</LINE><STAGEDIR>Aside</STAGEDIR><LINE>not   to be.</LINE></SPEECH>
</SCENE></ACT></PLAY>"""


def test_decode_member_prefers_utf8_then_nltks_codec():
    assert decode_member("inaugural/x.txt", "café".encode()) == "café"
    assert decode_member("genesis/french.txt", "été".encode("latin-1")) == "été"
    assert decode_member("genesis/swedish.txt", "å".encode("cp865")) == "å"
    assert decode_member("state_union/1970-Nixon.txt", "ł".encode("iso-8859-2")) == "ł"
    with pytest.raises(SourceError, match="no codec"):
        decode_member("other/x.txt", b"\xff\xfe\xfa")


def test_play_text_lays_a_play_out_as_tiny_shakespeare():
    assert play_text(PLAY) == ("The Tragedy of X\n\nDramatis Personae\n\nX, a king.\n\nACT I\n\nSCENE I. A room.\n\n"
                               "Enter X\n\nX:\nTo be, or\nAside\nnot to be.\n")


def test_parse_part():
    assert parse_part("sharegpt:") == ("sharegpt", "")
    assert parse_part("text:a/b:c") == ("text", "a/b:c")
    for bad in ("sharegpt", ":x", "mix:y"):
        with pytest.raises(SourceError):
            parse_part(bad)


def test_router_pins_train_only_groups():
    router = DocumentRouter(val_fraction=1.0, seed=0, train_only=("*shakespeare*",))
    assert router.route(b"k1", "books/shakespeare-hamlet.txt").split == "train"
    assert router.route(b"k2", "books/austen-emma.txt").split == "val"   # val_fraction 1: everything else is val
    assert router.route(b"k3", "").split == "val"


def test_real_nltk_zips(shared_data):
    root = shared_data / "corpora" / "nltk_public_domain"
    docs = list(build_source(SourceSpec(name="nltk-zip", path=str(root), group_by_file=True)).documents())
    want = []
    for z in sorted(root.glob("*.zip")):
        names = sorted(n for n in zipfile.ZipFile(z).namelist() if not n.endswith("/"))
        want += [f"{z.name}/{n}" for n in names if not n.rsplit("/", 1)[-1].startswith("README")
                 and not n.endswith((".dtd", ".css"))]
    assert [d.group for d in docs] == want
    assert len(want) == 8 + 59 + 8 + 65  # genesis, inaugural, shakespeare's plays, state_union
    hamlet = next(d.text for d in docs if d.group.endswith("shakespeare/hamlet.xml"))
    assert hamlet.startswith("The Tragedy of Hamlet, Prince of Denmark\n\n") and "<" not in hamlet
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    french = next(d.text for d in docs if d.group.endswith("genesis/french.txt"))
    assert "Dieu" in french and "\ufffd" not in french


def test_mix_config_loads_and_refuses_a_mix_without_parts():
    cfg = load_config(PrepareConfig, CONFIG)
    assert cfg.source == "mix" and cfg.val_name == "sharegpt-corpora-v1" and len(cfg.parts) == 4
    assert not any("wikitext" in p for p in cfg.parts)   # the held-out check stays out of the corpus
    with pytest.raises(ConfigError, match="parts"):
        load_config(PrepareConfig, None, ['source="mix"'])


@pytest.fixture(scope="module")
def prepared(shared_data, tmp_path_factory):
    """The committed config on the real corpora, ShareGPT swapped for 40 conversations of a small file."""
    tmp = tmp_path_factory.mktemp("mix")
    convs = [{"id": f"c{i // 2}_{i % 2}", "conversations": [{"from": "human", "value": f"question {i} about x"},
                                                            {"from": "gpt", "value": f"answer {i}: y"}]}
             for i in range(40)]
    (tmp / "sg.json").write_text(json.dumps(convs))
    corpora = shared_data / "corpora"
    parts = [f"sharegpt:{tmp / 'sg.json'}", f"text:{corpora / 'gutenberg_nltk'}",
             f"nltk-zip:{corpora / 'nltk_public_domain'}", f"text:{corpora / 'tinyshakespeare'}"]
    cfg = load_config(PrepareConfig, CONFIG, [f"parts={json.dumps(parts)}", f'out_dir="{tmp / "out"}"',
                                              "workers=1", "progress=false", "shard_tokens=2000000"])
    return cfg, prepare(cfg)


def test_real_mix_prepares_one_manifest_with_the_named_val_split(prepared):
    cfg, manifest = prepared
    assert [p["label"] for p in manifest.source["parts"]] == ["sg.json", "gutenberg_nltk", "nltk_public_domain",
                                                               "tinyshakespeare"]
    assert manifest.val_source["val_name"] == "sharegpt-corpora-v1"
    assert manifest.val_source["train_only"] == cfg.train_only
    assert verify_shards(cfg.out_dir) == sum(manifest.tokens.values())
    # the split, re-derived document by document: Shakespeare and Genesis in train only; val holds whole works
    router = DocumentRouter(cfg.val_fraction, cfg.seed, tuple(cfg.train_only))
    routes = [(d.group, router.route_document(d).split)
              for d in build_source(cfg.source_spec()).documents()]
    val = [g for g, s in routes if s == "val"]
    assert not [g for g in val if "shakespeare" in g or "genesis" in g]
    assert {g.split("/")[0] for g in val} >= {"nltk_public_domain"}   # speeches reach val, not only chat
    assert manifest.documents["val"] == len(val) and manifest.documents["train"] + len(val) <= len(routes)
    # about 5% of the text, with the corpus's ~3-4M tokens: enough val tokens for a stable loss
    share = manifest.tokens["val"] / sum(manifest.tokens.values())
    assert 0.01 < share < 0.15, share
