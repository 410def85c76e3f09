"""configs/pretrain/prepare-fineweb-edu.toml through local files of the formats it reads online: FineWeb-Edu parquet
(a "text" column) and FineWeb's llm.c-format val shard; and the hub revision resolved to a commit in the manifest."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalelab.core.config import load_config
from scalelab.pretrain.prepare import PrepareConfig, prepare
from scalelab.pretrain.shards import read_shard, write_shard
from scalelab.pretrain.sources import HubSource, SourceError, SourceSpec

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "pretrain" / "prepare-fineweb-edu.toml"
TRAIN_CONFIG = REPO / "configs" / "pretrain" / "gpt2-124m-fineweb-edu.toml"


def test_train_config_reads_what_the_prepare_config_writes():
    prep = tomllib.loads(CONFIG.read_text())
    train = tomllib.loads(TRAIN_CONFIG.read_text())
    assert train["data"]["dir"] == prep["out_dir"]
    assert train["data"]["val_tokens"] == prep["val_max_tokens"] == 10_485_760    # the speedrun's val budget
    assert (prep["source"], prep["hub_name"], prep["val_source"]) == ("fineweb-edu", "sample-10BT", "fineweb-val")


def test_prepare_config_on_local_files_of_the_same_formats(tmp_path):
    parquet_dir = tmp_path / "sample" / "10BT"
    parquet_dir.mkdir(parents=True)
    texts = [f"Lesson {i}: the water cycle moves water between the sea, the air and the land." for i in range(40)]
    pq.write_table(pa.table({"text": texts[:20], "id": list(range(20))}), parquet_dir / "000_00000.parquet")
    pq.write_table(pa.table({"text": texts[20:], "id": list(range(20, 40))}), parquet_dir / "001_00000.parquet")
    val = np.random.default_rng(0).integers(0, 50257, size=500)
    write_shard(tmp_path / "fineweb_val_000000.bin", val)
    out = tmp_path / "out"
    cfg = load_config(PrepareConfig, str(CONFIG), [f"path={json.dumps(str(parquet_dir))}",
                                                    f"val_path={json.dumps(str(tmp_path / 'fineweb_val_000000.bin'))}",
                                                    f"out_dir={json.dumps(str(out))}", "val_max_tokens=128",
                                                    "workers=1", "progress=false"])
    manifest = prepare(cfg)
    assert manifest.val_source["name"] == "fineweb-val" and manifest.val_source["tokens"] == 128
    np.testing.assert_array_equal(read_shard(out / "val_000000.bin"), val[:128])   # FineWeb's first val tokens
    train = np.concatenate([read_shard(p) for p in sorted(out.glob("train_*.bin"))])
    assert manifest.source["name"] == "fineweb-edu" and manifest.source["options"] == {"field": "text"}
    # every document went to train: 40 documents, each followed by <|endoftext|> (50256)
    assert int((train == 50256).sum()) == 40


class FakeApi:
    def dataset_info(self, repo_id, revision=None):
        if revision == "no-such-branch":
            raise RuntimeError("Revision Not Found")
        return type("Info", (), {"sha": f"{repo_id}@{revision}-sha"})()


def test_hub_revision_is_recorded_as_its_commit(monkeypatch):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    spec = SourceSpec(name="fineweb-edu", hub_id="HuggingFaceFW/fineweb-edu", hub_name="sample-10BT",
                      hub_revision="main")
    assert HubSource(spec).describe()["commit"] == "HuggingFaceFW/fineweb-edu@main-sha"
    bad = SourceSpec(name="fineweb-edu", hub_id="HuggingFaceFW/fineweb-edu", hub_revision="no-such-branch")
    with pytest.raises(SourceError, match="HuggingFaceFW/fineweb-edu@no-such-branch: cannot resolve"):
        HubSource(bad).describe()
