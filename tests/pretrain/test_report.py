"""Report: a hand-written run folder (with a kill + resume that repeats steps) -> exact numbers, table, PNGs."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scalelab.core.config import dump_toml
from scalelab.core.jsonio import append_jsonl
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.predict import write_predictions
from scalelab.pretrain.report import build_report, results_from_run, summarize

TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16", "model.vocab_size=256",
        "model.padded_vocab_size=256", "train.micro_batch_size=4", "train.device=cpu", "train.max_steps=8",
        "schedule.warmup_steps=2"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def train(t: float, step: int, loss: float, tps: float, mem: float) -> dict:
    return {"event": "train", "time_unix": t, "step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
            "step_ms": 64_000 / tps, "tokens_per_s": tps, "mfu": 0.1, "memory_gib": mem, "tokens": 64 * step}


def events() -> list[dict]:
    start = {"n_params": 34176, "world_size": 1, "grad_accum": 1, "tokens_per_step": 64, "device": "cpu",
             "torch": "2.13.0+cpu"}
    session1 = [{"event": "run_start", "time_unix": 1000.0, "step": 0, **start},
                *(train(1000.0 + s, s, 6.0 - 0.1 * s, 500.0 + s, 1.0) for s in (1, 2, 3)),
                train(1004.0, 4, 5.6, 1000.0, 1.1), {"event": "checkpoint", "time_unix": 1004.2, "step": 4},
                train(1005.0, 5, 5.55, 9999.0, 1.2), train(1006.0, 6, 5.5, 9999.0, 1.2),
                {"event": "val", "time_unix": 1006.5, "step": 6, "val_loss": 5.9, "tokens": 384}]
    # killed after step 6; the resumed process repeats steps 5 and 6 from the step-4 checkpoint
    session2 = [{"event": "resume", "time_unix": 2000.0, "step": 4}, {"event": "run_start", "time_unix": 2000.5,
                                                                      "step": 4, **start},
                train(2001.0, 5, 5.4, 800.0, 1.5), train(2002.0, 6, 5.3, 800.0, 1.5),
                {"event": "val", "time_unix": 2002.5, "step": 6, "val_loss": 5.7, "tokens": 384},
                train(2003.0, 7, 5.25, 800.0, 1.5), train(2004.0, 8, 5.1, 1200.0, 1.4),
                {"event": "val", "time_unix": 2005.0, "step": 8, "val_loss": 5.2, "tokens": 512},
                {"event": "run_end", "time_unix": 2010.0, "steps": 8}]
    return session1 + session2


def make_run(tmp: Path, *extra: str) -> Path:
    data = tmp / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"unigram_baseline": {"val_cross_entropy_nats": 5.35}}))
    cfg = load_pretrain_config(None, [*TINY, f"data.dir={json.dumps(str(data))}",
                                      f"run.out_dir={json.dumps(str(tmp))}", "run.name=r", *extra])
    write_predictions(cfg)  # before the run, as the CLI does: logs predictions_written first
    dump_toml(cfg, cfg.run_dir / "config.toml")
    for ev in events():
        append_jsonl(cfg.run_dir / "metrics.jsonl", ev)
    return cfg.run_dir


def test_summarize_takes_last_record_per_step(tmp_path):
    d = summarize(make_run(tmp_path))
    assert [s for s, _, _ in d.train_curve] == list(range(1, 9))
    assert dict((s, v) for s, _, v in d.train_curve)[5] == 5.4 and d.final_train_loss == 5.1
    assert [(s, v) for s, _, v in d.val_curve] == [(6, 5.7), (8, 5.2)] and d.final_val_loss == 5.2
    # steady = each session's steps after its first 3: step 4 (session 1) and step 8 (session 2); the
    # session-1 records of steps 5, 6 (9999 tok/s) were replaced by the resumed run's
    assert d.tokens_per_s == 1100.0 and d.step_ms == pytest.approx((64.0 + 64_000 / 1200) / 2)
    assert d.peak_memory_gib == 1.5 and d.steps == 8 and d.tokens == 512 and d.resumes == 1
    assert d.cost.sessions == 2 and d.cost.wall_s == pytest.approx(6.5 + 10.0)
    assert d.cost.is_cpu and d.cost.cost_usd == pytest.approx(16.5 / 3600 * 0.10)
    assert d.unigram_val_loss == 5.35 and d.predictions_logged_before_run
    tps = d.comparisons[0]
    assert tps.measured == 1100.0 and tps.inside == (tps.low <= 1100.0 <= tps.high)


def test_a_relaunch_of_the_finished_run_adds_no_wall_time(tmp_path):
    run = make_run(tmp_path)
    append_jsonl(run / "metrics.jsonl", {"event": "relaunch", "time_unix": 2010.0 + 36_000, "nproc": 1})
    d = summarize(run)
    assert d.cost.sessions == 2 and d.cost.wall_s == pytest.approx(6.5 + 10.0)


def test_report_markdown_and_pngs(tmp_path):
    run = make_run(tmp_path, "run.price_per_gpu_hour=2.0")
    path = build_report(run)
    text = path.read_text()
    d = summarize(run)
    loss = d.comparisons[3]
    assert f"| final val loss (nats/token) | {loss.predicted:.4f} | {loss.low:.4f} – {loss.high:.4f} | 5.2000 | yes |" \
        in text
    assert "| 1,100 |" in text and "| 1.500 |" in text
    assert "| tokens per step | 64 |" in text and "| world size x grad accum | 1 x 1 |" in text
    assert "linear warmup 2 steps" in text and "from run.price_per_gpu_hour" in text
    assert f"**${16.5 / 3600 * 2.0:,.4f}**" in text
    for name in ("loss.png", "lr.png"):
        png = (run / "figures" / name).read_bytes()
        assert png[:8] == PNG_MAGIC and len(png) > 1000


def test_results_from_run_is_json(tmp_path):
    res = results_from_run(make_run(tmp_path))
    json.dumps(res)
    assert res["final_val_loss"] == 5.2 and res["tokens_per_s"] == 1100.0
    assert [c["name"] for c in res["comparisons"]] == ["tokens/s", "step time", "peak memory", "final val loss"]


def test_missing_metrics_names_the_file(tmp_path):
    run = make_run(tmp_path)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        build_report(run)


def test_unigram_baseline_is_scored_on_the_evaluated_val_tokens(tmp_path):
    import numpy as np
    from scalelab.pretrain.prepare import UNIGRAM_COUNTS_FILE, save_counts
    from scalelab.pretrain.report import unigram_baseline
    from scalelab.pretrain.shards import write_shard
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "train_000000.bin", np.array([0, 0, 1, 2]))
    val = [3, 0, 3, 1, 2, 2, 2, 2, 2, 0, 1, 1, 3, 3, 0, 0, 2, 1, 1, 1]
    write_shard(data / "val_000000.bin", np.array(val))
    save_counts(data / UNIGRAM_COUNTS_FILE, np.array([2, 1, 1, 0]))
    cfg = load_pretrain_config(None, [f"data.dir={str(data)!r}", "data.val_tokens=16", "model.block_size=8",
                                      "train.micro_batch_size=1", "model.vocab_size=4", "model.padded_vocab_size=4"])
    # val_tokens=16 at B*T=8: two windows whose targets are val[1:17]; q = (c+1)/(4+4) = (3/8, 2/8, 2/8, 1/8)
    q = {0: 3 / 8, 1: 2 / 8, 2: 2 / 8, 3: 1 / 8}
    expected = -sum(math.log(q[t]) for t in val[1:17]) / 16
    assert unigram_baseline(cfg) == pytest.approx(expected)
    cfg.train.micro_batch_size = 3  # one short batch of the same two windows: the same tokens
    assert unigram_baseline(cfg) == pytest.approx(expected)


def test_a_committed_run_with_its_metrics_packed_reports_the_same(tmp_path):
    """Results folders keep metrics.jsonl xz-packed (core.recordgz); the report reads the packed file as the plain."""
    import lzma
    run = make_run(tmp_path)
    plain = summarize(run)
    metrics = run / "metrics.jsonl"
    (run / "metrics.jsonl.xz").write_bytes(lzma.compress(metrics.read_bytes()))
    metrics.unlink()
    packed = summarize(run)
    assert (packed.tokens_per_s, packed.final_val_loss, packed.steps, packed.peak_memory_gib) == (
        plain.tokens_per_s, plain.final_val_loss, plain.steps, plain.peak_memory_gib) == (1100.0, 5.2, 8, 1.5)
