"""Time to target: the trainer's stop at train.target_val_loss, and bench/gpu_pretrain_ttt.py's accounting (curves
from metrics rows with resumes and compile warm-up, the crossing, the ratio) on hand-made rows; the whole
bench/gpu_pretrain_ttt.sh at toy scale on CPU, including a call after the machine lost its run folders."""
from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.pretrain import train_gpt
from scalelab.pretrain.shards import write_shard
from tests.pretrain.test_train_gpt import data_dir, losses, make_cfg, markov_tokens  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_pretrain_ttt as ttt  # noqa: E402


def test_target_val_loss_stops_at_first_evaluation_below_it(data_dir, tmp_path):  # noqa: F811
    extra = ["train.max_steps=20", "train.val_every=4"]
    free = make_cfg(data_dir, tmp_path / "free", *extra)
    train_gpt.train(free)
    val = losses(free.run_dir, "val", "val_loss")  # steps 4, 8, ..., 20
    target = val[8] + 1e-9  # reached at step 8 at the latest (val may dip below earlier, at step 4)
    first = min(s for s, v in val.items() if v <= target)
    stop = make_cfg(data_dir, tmp_path / "stop", *extra, f"train.target_val_loss={target!r}")
    summary = train_gpt.train(stop)
    assert summary["steps"] == first and summary["final_val_loss"] <= target
    assert losses(stop.run_dir) == {s: v for s, v in losses(free.run_dir).items() if s <= first}  # same run, cut
    assert torch.load(stop.run_dir / "checkpoint.pt", weights_only=True)["step"] == first


def rows(session_ms: list[list[tuple[int, float]]], vals: dict[int, float], tok: int = 100) -> list[dict]:
    """metrics.jsonl rows: sessions of (step, step_ms) train records, then val records at the given steps."""
    out = []
    for session in session_ms:
        out.append({"event": "run_start"})
        for step, ms in session:
            out.append({"event": "train", "step": step, "step_ms": ms, "tokens": step * tok})
            if step in vals:
                out.append({"event": "val", "step": step, "tokens": step * tok, "val_loss": vals[step]})
    return out


def test_curve_counts_warmup_at_steady_speed_and_keeps_the_resumed_steps():
    # session 1: steps 1-6 (1-3 compile: 5000 ms), killed after its checkpoint at 4; session 2 repeats 5-6 and
    # runs to 8 (5-7 compile again). Surviving records: 1-4 from session 1, 5-8 from session 2.
    s1 = [(1, 5000), (2, 5000), (3, 5000), (4, 100), (5, 110), (6, 120)]
    s2 = [(5, 4000), (6, 4000), (7, 4000), (8, 140)]
    c = ttt.curve_from_rows(rows([s1, s2], {4: 3.0, 8: 2.0}), finished=True)
    # steady steps: 4 (100 ms) and 8 (140 ms) -> median 120 ms; warm-up steps 1-3 and 5-7 count 120 ms each
    assert c.median_step_ms == 120
    assert c.train_s == pytest.approx((6 * 120 + 100 + 140) / 1000)
    assert c.train_s_raw == pytest.approx((3 * 5000 + 100 + 3 * 4000 + 140) / 1000)
    assert c.steps == 8 and c.tokens == 800 and c.sessions == 2
    assert [(p.step, p.val_loss) for p in c.val] == [(4, 3.0), (8, 2.0)]
    assert c.val[0].train_s == pytest.approx((3 * 120 + 100) / 1000)
    assert c.tokens_per_s == pytest.approx(100 / 0.120)


def test_a_committed_run_folder_reads_packed_as_plain(tmp_path):
    # committed run folders keep metrics.jsonl as .xz (the tracked tree's budget); the curve must not change, and a
    # torn last line (a kill mid-write) is skipped in either form
    text = "".join(json.dumps(r) + "\n" for r in rows([[(1, 900), (2, 900), (3, 900), (4, 100)]], {4: 3.0}))
    text += '{"event": "train", "st'
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for d in (plain, packed):
        d.mkdir()
        (d / "train_summary.json").write_text("{}")
    (plain / "metrics.jsonl").write_text(text)
    (packed / "metrics.jsonl.xz").write_bytes(lzma.compress(text.encode()))
    c = ttt.read_run(packed)
    assert c == ttt.read_run(plain)
    assert c.steps == 4 and c.finished and [(p.step, p.val_loss) for p in c.val] == [(4, 3.0)]
    assert ttt.read_run(tmp_path) is None   # no metrics in any form


def test_time_to_target_first_crossing_and_interpolation():
    val = (ttt.ValPoint(5, 500, 10.0, 4.0), ttt.ValPoint(10, 1000, 20.0, 3.0), ttt.ValPoint(15, 1500, 30.0, 2.5))
    hit = ttt.time_to_target(val, 3.2)
    assert hit["step"] == 10 and hit["train_s"] == 20.0
    assert hit["train_s_interpolated"] == pytest.approx(10.0 + 0.8 * 10.0)  # (4.0 - 3.2) / (4.0 - 3.0) = 0.8
    assert ttt.time_to_target(val, 4.5)["train_s_interpolated"] == 10.0  # already below at the first evaluation
    assert ttt.time_to_target(val, 2.0) is None


def curve(points: list[tuple[int, float, float]], finished: bool = True) -> ttt.RunCurve:
    val = tuple(ttt.ValPoint(s, s * 100, t, v) for s, t, v in points)
    return ttt.RunCurve(points[-1][0], points[-1][0] * 100, points[-1][1], points[-1][1], 1.0, 1.0, 1, finished, val)


def test_compare_ratio_against_the_baselines_whole_budget():
    base = curve([(10, 10.0, 3.5), (20, 20.0, 3.0), (30, 30.0, 2.9), (40, 40.0, 3.0)])  # target: final 3.0
    fast = curve([(10, 9.0, 3.2), (20, 18.0, 2.95)])
    v = ttt.compare(base, fast)
    assert v["target_val_loss"] == 3.0 and v["status"] == "done"
    assert v["ratio"] == pytest.approx(18.0 / 40.0) and v["goal_met"] and v["token_ratio"] == 0.5
    assert ttt.compare(base, curve([(40, 35.0, 3.1)]))["status"] == "recipe did not reach the target"
    assert ttt.compare(base, curve([(10, 9.0, 3.1)], finished=False))["status"] == "recipe not finished"
    assert ttt.compare(curve([(10, 10.0, 3.5)], finished=False), fast)["status"] == "baseline not finished"


def test_a_curve_survives_the_results_file():
    c = curve([(10, 10.0, 3.5), (20, 20.0, 3.0)])
    assert ttt.curve_from_dict(json.loads(json.dumps(ttt.curve_dict(c)))) == c


@pytest.mark.slow
def test_bench_script_end_to_end_on_cpu(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    tokens = markov_tokens(24_000, 1)  # one chain for train and val, so val loss falls
    write_shard(data / "train_000000.bin", tokens[:20_000])
    write_shard(data / "val_000000.bin", tokens[20_000:])
    (data / "manifest.json").write_text(json.dumps({"source": "markov", "seed": 1}))
    tiny = ('train.device="cpu" train.compile=false train.dtype="float32" model.n_layer=2 model.n_head=2 '
            'model.n_embd=32 model.block_size=16 model.vocab_size=256 model.padded_vocab_size=256 '
            'train.micro_batch_size=2 optim.lr=3e-3')  # 32 tokens per micro-step
    env = {**os.environ, "OUT": str(tmp_path / "out"), "ROOT": str(tmp_path / "root"), "DATA": str(data),
           "RESULT": str(tmp_path / "result.json"), "TOKENS": str(64 * 30), "TOKENS_PER_STEP": "64",
           "RECIPE_TOKENS_PER_STEP": "32", "RECIPE_TOKENS": str(32 * 40), "VAL_EVERY": "5",
           "CKPT_EVERY": "10", "MIN_LEFT_S": "30", "EXTRA_SETS": tiny, "RECIPE_SETS": 'train.optimizer="muon" optim.muon_lr=0.03',
           "OMP_NUM_THREADS": "1", "SCALELAB_GIT_SHA": "0" * 40,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = ["bash", "bench/gpu_pretrain_ttt.sh"]
    done = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("complete"), done.stdout[-2000:] + done.stderr
    doc = json.loads((tmp_path / "out" / "pretrain_time_to_target.json").read_text())
    base, recipe, verdict = doc["runs"]["baseline"], doc["runs"]["recipe"], doc["verdict"]
    assert base["steps"] == 30 and verdict["target_val_loss"] == base["final_val_loss"]
    assert base["tokens"] == 64 * 30 and recipe["tokens"] == 32 * recipe["steps"]  # each run at its own batch
    assert "train.max_steps=40" in doc["commands"]["recipe"]  # RECIPE_TOKENS / RECIPE_TOKENS_PER_STEP
    if verdict["status"] == "done":  # the recipe stopped at its first evaluation at or below the target
        assert recipe["steps"] == verdict["recipe_to_target"]["step"] and recipe["final_val_loss"] <= base[
            "final_val_loss"]
    assert "train.target_val_loss=" in doc["commands"]["recipe"] and doc["provenance"]["git_sha"] == "0" * 40
    for name in ("baseline", "recipe"):   # each run wrote its predictions before its first step
        first = json.loads((tmp_path / "root" / name / "metrics.jsonl").read_text().splitlines()[0])
        assert first["event"] == "predictions_written" and (tmp_path / "root" / name / "predictions.json").is_file()
    # a fresh machine (run folders gone) with the results file: nothing retrains, the report is the same
    for f in (tmp_path / "root").rglob("*"):
        if f.is_file():
            f.unlink()
    again = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert "== baseline: finished" in again.stdout and again.stdout.strip().endswith("complete"), again.stdout
    assert json.loads((tmp_path / "result.json").read_text())["runs"] == doc["runs"]
    # other settings against the same results file: refused, nothing trained
    refused = subprocess.run(script, cwd=REPO, env={**env, "VAL_EVERY": "10"}, capture_output=True, text=True)
    assert refused.returncode == 2 and "other settings" in refused.stderr

