"""pretrain.docs_blind: a blind-prediction folder shows its scores only once scored.json exists, with the counts read
from it; hand-made records."""
from __future__ import annotations

import json
from pathlib import Path

from scalelab.pretrain.docs_blind import blind_section, blind_summary


def predictions(gpu: str) -> dict:
    return {"written_unix": 1796600000.0, "git_sha": "94996e8" + "0" * 33,
            "sizes": [{"size": "774M", "prediction": {"hardware_name": gpu}}, {"size": "1.5B"}]}


def row(q: str, p: float, lo: float, hi: float, m: float | None, inside: bool | None) -> dict:
    return {"quantity": q, "predicted": p, "low": lo, "high": hi, "measured": m,
            "error": None if m is None else m / p - 1, "inside": inside}


def test_scored_and_unscored_folders(tmp_path: Path):
    h100, h200 = tmp_path / "h100", tmp_path / "h200"
    for folder, gpu in ((h100, "NVIDIA H100 SXM 80GB"), (h200, "NVIDIA H200 SXM 141GB")):
        folder.mkdir()
        (folder / "predictions.json").write_text(json.dumps(predictions(gpu)))
    scored = {"git_sha": "abcdef0" + "1" * 33, "command": "python bench/pretrain_blind_score.py X", "sizes": [
        {"size": "774M", "measured": {"steps": 512, "complete": True},
         "rows": [row("tokens/s", 1000.0, 900.0, 1100.0, 950.0, True),
                  row("peak memory GiB", 10.0, 9.0, 11.0, 12.0, False)]},
        {"size": "1.5B", "measured": {"steps": 300, "complete": False},
         "rows": [row("final val loss", 5.0, 4.5, 5.5, None, None)]}]}
    (h100 / "scored.json").write_text(json.dumps(scored))
    text = "\n".join(blind_section([(h100, "results/h100/x"), (h200, "results/h200/x")]))
    assert text.count("## Blind predictions of sizes never trained here") == 1
    assert ("**NVIDIA H100 SXM 80GB** (`results/h100/x/predictions.json`, 774M and 1.5B, written 2026-12-06 at git "
            "94996e8), scored by `python bench/pretrain_blind_score.py X`:") in text
    assert "| 774M | 512 | tokens/s | 1,000 (900–1,100) | 950 | -5.0% | yes |" in text
    assert "| 774M | 512 | peak memory GiB | 10.0 (9.0–11.0) | 12.0 | +20.0% | **no** |" in text
    assert "| 1.5B | 300 (cut off) | final val loss | 5.000 (4.500–5.500) | not measured | — | — |" in text
    assert "1 of 2 measured quantities inside their intervals; not measured: 1.5B final val loss." in text
    assert "The loss is the weak side" not in text   # no loss measured yet
    assert blind_summary([(h100, "a"), (h200, "b")]) == ("1 of 2 measured quantities of 774M and 1.5B on one NVIDIA "
                                                         "H100 SXM 80GB inside their intervals; outside: 774M peak "
                                                         "memory GiB (+20.0%)")
    h200_part = text[text.index("**NVIDIA H200"):]
    assert "written 2026-12-06 at git 94996e8): not run yet." in h200_part and "| size |" not in h200_part


def test_no_folders_no_section():
    assert blind_section([]) == []


def test_the_loss_rows_are_read_together(tmp_path: Path):
    (tmp_path / "predictions.json").write_text(json.dumps(predictions("G")))
    (tmp_path / "scored.json").write_text(json.dumps({"command": "c", "sizes": [
        {"size": "774M", "measured": {"steps": 512, "complete": True},
         "rows": [row("final val loss", 5.1947, 4.8, 5.6, 5.5, True)]},
        {"size": "1.5B", "measured": {"steps": 512, "complete": True},
         "rows": [row("final val loss", 5.1943, 4.8, 5.55, 5.575, False)]}]}))
    text = "\n".join(blind_section([(tmp_path, "res/b")]))
    assert "gave every larger size about its data term, 5.19, and they measured 774M 5.500, 1.5B 5.575" in text
    assert "(res/b/README.md reads each row)" in text
