"""The recipe-variant rounds come from the docs manifest: their names are the manifest's, sections find a round by
kind, and a manifest that lists fewer rounds renders without the missing rounds' readings."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from scalelab.core.jsonio import is_stored
from scalelab.core.sections import read_manifest
from scalelab.pretrain.docs import load_inputs, render
from scalelab.pretrain.rounds import Round, Rounds, load_round

REPO = Path(__file__).resolve().parents[2]


def test_rounds_by_kind_and_names():
    r = Rounds((Round("a", "goal", {"x": 1}), Round("b", "fp8-tensor", {}), Round("c", "fp8-row", {"y": 2})))
    assert r.get("fp8-row") == {"y": 2} and r.get("row-kernels") is None and r.latest() == {"y": 2}
    assert r.names("fp8-tensor", "fp8-row") == "b-c" and r.names("goal") == "a" and r.names("variants") == ""
    with pytest.raises(KeyError, match="known kinds"):
        r.get("fp9")


def test_load_round_refuses_unknown_kinds_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="round kind 'nope'"):
        load_round(tmp_path, tmp_path, "1", "nope")
    with pytest.raises(FileNotFoundError, match="round 1: .*results.json does not exist"):
        load_round(tmp_path, tmp_path, "1", "goal")


def _manifest(tmp_path: Path, keep: int, names: list[str]) -> Path:
    text = (REPO / "docs/pretrain.toml").read_text()
    head, *rounds = text.split("\n[[speed.rounds]]\n")
    rounds = [re.sub(r'name = "\d+"', f'name = "{n}"', r) for r, n in zip(rounds[:keep], names)]
    path = tmp_path / "pretrain.toml"
    path.write_text(head + "".join("\n[[speed.rounds]]\n" + r for r in rounds))
    return path


def test_round_names_and_count_come_from_the_manifest(tmp_path):
    m = read_manifest(_manifest(tmp_path, 3, ["A", "B", "C"]), root=REPO, job="pretrain")
    text = render(load_inputs(m))
    assert "| cudnn-fp8-all | A | 516k | 1.065 |" in text            # the first round's row, under its new name
    assert "| cudnn-fp8-all-chunks8-b128-tk | C | 578k | 1.193 |" in text
    assert "Round 5's kernels" not in text and "### Where the step goes" in text   # per-tensor profiles only
    assert "(`bench/gpu_pretrain_profile.py`, round C;" in text


def test_predict_reads_the_committed_calibration_and_ladder_from_their_run_folders():
    from scalelab.pretrain.predict import CALIBRATION_PATH, LADDER_PATH
    assert CALIBRATION_PATH.parent.name == "predictor-calibration" and is_stored(CALIBRATION_PATH)
    assert LADDER_PATH.parent.name == "scaling-ladder" and LADDER_PATH.is_file()
