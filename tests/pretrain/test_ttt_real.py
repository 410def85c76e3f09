"""bench/gpu_pretrain_ttt_real.sh at toy scale on CPU: the lr grid (extended until its best is inside), the
baseline's seeds, the target from them, the recipe's seeds stopping at it, each run one pass at most and scored on a
held-out shard beside its val loss, the run folders in the results layout, stats.json by ttt_stats; a second call
retrains and rescores nothing."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.pretrain import ttt_stats
from scalelab.pretrain.shards import one_pass, write_shard
from tests.pretrain.test_train_gpt import markov_tokens

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
TINY = ('train.device="cpu" train.compile=false train.dtype="float32" model.n_layer=2 model.n_head=2 '
        'model.n_embd=32 model.block_size=16 model.vocab_size=256 model.padded_vocab_size=256 '
        'train.micro_batch_size=2')  # 32 tokens per micro-step


def _final(run: Path) -> float:
    vals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in vals if r.get("event") == "val"][-1]


def recipes(results: Path) -> list[Path]:
    return sorted((results / "recipe").iterdir())


def test_bench_script_end_to_end_on_cpu(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    tokens = markov_tokens(4_000, 1)
    # 3,200 tokens hold 199 windows of 17 at stride 16: 99 micro-batches of 2, so one pass is 49 steps of 2
    # micro-batches (not 3,200 / 64 = 50, whose last micro-batch would start a second epoch)
    write_shard(data / "train_000000.bin", tokens[:3_200])
    write_shard(data / "val_000000.bin", tokens[3_200:])
    held = tmp_path / "held"
    held.mkdir()
    write_shard(held / "held_000000.bin", markov_tokens(600, 5))   # the toy's WikiText-2: another chain's text
    steps = one_pass([3_200], batch=2, seq=16, world=1, accum=2).steps
    (data / "manifest.json").write_text(json.dumps({"source": "markov", "tokens": {"train": 3200, "val": 800}}))
    results = tmp_path / "results"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "ROOT": str(tmp_path / "root"), "DATA": str(data),
           "RESULTS": str(results), "TOKENS_PER_STEP": "64", "VAL_EVERY": "10", "CKPT_EVERY": "25",
           "GRID_LRS": "1e-4 1e-3 1e-2 1e-1", "SEEDS": "2", "MAX_GRID": "6", "MIN_LEFT_S": "30", "BUDGET_S": "900",
           "EXTRA_SETS": TINY, "RECIPE_SETS": 'train.optimizer="muon" optim.muon_lr=0.03 optim.lr=3e-3',
           "OMP_NUM_THREADS": "1", "SCALELAB_GIT_SHA": "0" * 40, "HELDOUT": str(held),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = ["bash", "bench/gpu_pretrain_ttt_real.sh"]
    done = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0 and done.stdout.strip().endswith("complete"), done.stdout[-3000:] + done.stderr
    grid = sorted((results / "grid").iterdir())
    rule = ttt_stats.grid_rule([float(d.name.removeprefix("lr-")) for d in grid], [_final(d) for d in grid])
    assert rule.status == "tuned" and len(grid) >= 4
    stats = json.loads((results / "stats.json").read_text())
    assert stats["status"] == "done" and stats["grid"]["best_lr"] == rule.best_lr
    base = [results / "baseline" / f"seed-{s}" for s in (1, 2)]
    assert stats["target_val_loss"] == pytest.approx(sum(_final(b) for b in base) / 2)
    assert steps == 49
    for b in base:  # one pass each at the tuned lr, no checkpoint kept, the exact command beside it
        summary = json.loads((b / "train_summary.json").read_text())
        assert summary["steps"] == steps and not (b / "checkpoint.pt").exists()
        ckpt = tmp_path / "root" / f"baseline-{b.name}" / "checkpoint.pt"   # still on the machine that trained it
        assert torch.load(ckpt, weights_only=True)["data"]["epoch"] == 0     # the pass never reached epoch 1
        lrs = re.findall(r"optim\.lr=([0-9.e+-]+)", (b / "cmd").read_text())
        assert len(lrs) == 1 and float(lrs[0]) == pytest.approx(rule.best_lr)
    for s, run in zip((1, 2), stats["recipe"]["runs"]):
        assert run["seed"] == s
        recipe = results / "recipe" / f"seed-{s}"
        assert "train.target_val_loss=" in (recipe / "cmd").read_text()
        if run["reached"]:
            assert _final(recipe) <= stats["target_val_loss"]
    assert not stats["faster"] and not stats["enough_seeds"]   # 2 seeds: never enough to call it
    assert set(stats["losses"]) == {f"{d.parent.name}/{d.name}" for d in [*grid, *base, *recipes(results)]}
    assert stats["command"].startswith("python3 bench/gpu_pretrain_ttt_real.py stats --results ") and stats["git_sha"]
    for name, row in stats["losses"].items():  # the held-out loss of every finished run, beside its val loss
        record = json.loads((results / name / "heldout.json").read_text())["wikitext2"]
        assert row["val_loss"] == pytest.approx(_final(results / name))
        assert row["wikitext2_loss"] == record["loss"] > 0 and row["wikitext2_tokens"] == record["tokens"] == 592
    assert (tmp_path / "out" / "ttt" / "stats.json").is_file()
    again = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.stdout.count(": finished") == len(grid) + 4 and again.stdout.strip().endswith("complete")
    assert "heldout.json" not in again.stdout   # recorded runs are not scored again
