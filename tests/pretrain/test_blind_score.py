"""bench/pretrain_blind_score.py: blind predictions scored against a finished run and a run cut off by its lease,
with every figure computed by hand; and the committed H100 scores are what the committed runs give."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.core.jsonio import read_json
from tests.bench_script import load_bench

score = load_bench("pretrain_blind_score")
REPO = Path(__file__).resolve().parents[2]
GIB = 2 ** 30


def size(name: str, layers: int, width: int, tps: float, mem_gib: float, loss: float) -> dict:
    return {"size": name, "shape": {"n_layer": layers, "n_head": 2, "n_embd": width},
            "sets": ["model.n_layer=2", "train.max_steps=8", "optim.lr=1e-3"],
            "loss_held_out_interval": [loss - 0.5, loss + 0.5],
            "prediction": {"throughput": {"tokens_per_s": tps, "tokens_per_s_low": 0.9 * tps,
                                          "tokens_per_s_high": 1.1 * tps},
                           "memory": {"total_bytes": mem_gib * GIB, "total_bytes_low": (mem_gib - 1) * GIB,
                                      "total_bytes_high": (mem_gib + 1) * GIB},
                           "loss": {"final_loss": loss}}}


def train_event(step: int, ms: float, mem: float) -> str:
    return json.dumps({"event": "train", "step": step, "step_ms": ms, "memory_gib": mem, "tokens": 100 * step})


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    preds = {"written_unix": 1.0, "git_sha": "p" * 40,
             "sizes": [size("small", 2, 64, 1000.0, 10.0, 5.0), size("big", 4, 128, 500.0, 20.0, 4.0)]}
    (tmp_path / "predictions.json").write_text(json.dumps(preds))
    done = tmp_path / "trained" / "L2-d64-s8"
    done.mkdir(parents=True)
    (done / "results.json").write_text(json.dumps({"steps": 8, "tokens_per_s": 1050.0, "peak_memory_gib": 11.5,
                                                   "final_val_loss": 5.25}))
    cut = tmp_path / "trained" / "L4-d128-s8"
    cut.mkdir()
    # steps 1-3 are warm-up (step 1 compiles); step 4 was run twice (a resume) and its later record counts
    lines = [train_event(1, 60000.0, 18.0), train_event(2, 150.0, 21.0), train_event(3, 190.0, 21.0),
             train_event(4, 999.0, 21.0), train_event(4, 200.0, 21.0), train_event(5, 250.0, 21.5),
             json.dumps({"event": "checkpoint", "step": 5}), train_event(6, 180.0, 21.5)]
    (cut / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_a_finished_and_a_cut_off_run_are_scored_by_hand(folder: Path, capsys):
    assert score.main([str(folder)]) == 0
    out = read_json(folder / "scored.json")
    small, big = out["sizes"]
    assert small["measured"]["complete"] and small["run"] == "L2-d64-s8"
    tps, mem, loss = small["rows"]
    assert tps["error"] == pytest.approx(0.05) and tps["inside"]                  # 1050 / 1000 - 1, within 900-1100
    assert mem["error"] == pytest.approx(0.15) and not mem["inside"]              # 11.5 outside 9-11 GiB
    assert loss["error"] == pytest.approx(0.05) and loss["inside"]                # 5.25 in 4.5-5.5
    # cut off: steps 4 (its second record, 200 ms), 5 and 6 are timed: sorted 180, 200, 250, upper median 200 ms
    assert not big["measured"]["complete"] and big["measured"]["steps"] == 6
    tps, mem, loss = big["rows"]
    assert tps["measured"] == pytest.approx(100 / 0.2) and tps["error"] == pytest.approx(0.0)   # 100 tokens a step
    assert mem["measured"] == 21.5 and mem["error"] == pytest.approx(0.075) and not mem["inside"]  # 21.5 > 21
    assert loss["measured"] is None and loss["error"] is None and loss["inside"] is None   # never extrapolated
    table = capsys.readouterr().out
    assert "| big | 6 (cut off) | final val loss | 4.000 (3.500–4.500) | not measured | — | — |" in table
    assert "| small | 8 | peak memory GiB | 10.00 (9.00–11.00) | 11.50 | +15.0% | no |" in table


def test_a_size_never_run_is_named(folder: Path):
    for f in (folder / "trained" / "L4-d128-s8").iterdir():
        f.unlink()
    with pytest.raises(FileNotFoundError, match="L4-d128-s8: neither results.json nor metrics.jsonl"):
        score.main([str(folder)])


def test_the_committed_h100_scores_come_from_the_committed_runs(tmp_path: Path):
    committed = REPO / "results" / "h100" / "pretrain" / "blind-sizes"
    scored = read_json(committed / "scored.json")
    again = [score.score_size(s, score.read_measured(committed / "trained" / score.run_name(s)))
             for s in read_json(committed / "predictions.json")["sizes"]]
    assert json.loads(json.dumps(again)) == scored["sizes"]
