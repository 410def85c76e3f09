"""Run folders (append-only metrics, hashed predictions) and the W&B / TensorBoard mirrors."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from scalelab.core.jsonio import append_jsonl, iter_jsonl, write_json
from scalelab.core.rundir import RunDir
from scalelab.core.tracking import JsonlFollower, make_sinks, mirrored_metrics
from scalelab.pretrain.config import load_pretrain_config


def test_run_folder_files(tmp_path):
    rd = RunDir(tmp_path / "r").create(load_pretrain_config())
    prov = rd.write_provenance({"data_manifest_sha256": "abc"})
    assert prov["data_manifest_sha256"] == "abc" and "git_sha" in prov and "torch" in prov["packages"]
    digest = rd.write_predictions({"tokens_per_s": 123.0})
    assert digest == hashlib.sha256((rd.path / "predictions.json").read_bytes()).hexdigest()
    assert [e["sha256"] for e in rd.events("predictions_written")] == [digest]
    written = rd.read("predictions.json")
    assert written["provenance"] == {"git_sha": prov["git_sha"], "command": prov["command"],
                                     "source": "provenance.json"}
    rd.write_predictions({**written, "extra": 1})   # an extended file keeps the provenance it was written with
    assert rd.read("predictions.json")["provenance"] == written["provenance"]
    rd.log_event("train", step=1, loss=float("nan"))
    assert list(rd.events("train"))[0]["loss"] == "nan"  # non-finite kept as text, file stays valid JSON
    assert (rd.path / "config.toml").read_text().startswith("[model]")


def test_torn_last_line_is_skipped_but_corruption_inside_is_an_error(tmp_path):
    p = tmp_path / "m.jsonl"
    append_jsonl(p, {"a": 1})
    append_jsonl(p, {"a": 2})
    with open(p, "a") as f:
        f.write('{"a": 3')  # a process killed mid-write
    assert [r["a"] for r in iter_jsonl(p)] == [1, 2]
    p.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(ValueError, match="m.jsonl:2: invalid JSON line"):
        list(iter_jsonl(p))


def test_atomic_json_write_leaves_no_tmp(tmp_path):
    write_json(tmp_path / "x.json", {"k": [1, 2]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"k": [1, 2]}
    assert os.listdir(tmp_path) == ["x.json"]


def test_tensorboard_mirror(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    metrics = tmp_path / "metrics.jsonl"
    for step, loss in [(1, 5.0), (2, 4.0)]:
        append_jsonl(metrics, {"event": "train", "step": step, "loss": loss})
    follower = JsonlFollower(metrics, make_sinks(["tensorboard"], tmp_path, "p", "n", {}))
    assert follower.drain() == 2 and follower.drain() == 0
    follower.stop()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 5.0), (2, 4.0)]


def test_mirrored_metrics_forwards_lines_written_in_the_body_even_when_it_fails(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    metrics = tmp_path / "metrics.jsonl"
    with pytest.raises(RuntimeError, match="crashed"):
        with mirrored_metrics(["tensorboard"], tmp_path, metrics, "p", "n", {}):
            for step, loss in [(1, 3.0), (2, 2.5)]:
                append_jsonl(metrics, {"event": "train", "step": step, "loss": loss})
            raise RuntimeError("crashed")
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 3.0), (2, 2.5)]
    with mirrored_metrics([], tmp_path / "none", metrics, "p", "n", {}):
        pass
    assert not (tmp_path / "none").exists()


def test_wandb_offline_mirror(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    metrics = tmp_path / "metrics.jsonl"
    append_jsonl(metrics, {"event": "train", "step": 1, "loss": 5.0})
    follower = JsonlFollower(metrics, make_sinks(["wandb"], tmp_path, "scalelab-test", "run", {"a": 1}))
    follower.stop()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_unknown_tracker_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        make_sinks(["mlflow"], tmp_path, "p", "n", {})
