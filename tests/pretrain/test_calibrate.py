"""Calibrated predictor: fits recover known constants, intervals cover the held-out rows, a held-out row by hand,
hardware transfer, the ladder file feeding the loss law, and the committed results/docs/config agreeing."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scalelab.core.hardware import get_hardware
from scalelab.core.jsonio import read_json, write_json
from scalelab.pretrain import calibrate as cal
from scalelab.pretrain import predict as predict_mod
from scalelab.pretrain.config import load_pretrain_config
from scalelab.pretrain.predict import default_loss_law, predict, workload
from scalelab.pretrain.scaling_law import ScalingLaw

REPO = Path(__file__).resolve().parents[2]
H200 = get_hardware("h200")
GPT2_124M = ["model.n_layer=12", "model.n_head=12", "model.n_embd=768", "model.block_size=1024", "train.compile=true"]
# Round constants for hand computation (not the fitted ones).
HAND = cal.Calibration(
    hardware="h200", throughput=cal.ThroughputFit(mfu_matmul=0.43, step_overhead_s=0.0045, bytes_per_logit=16.0,
                                                  attention_executed_fraction=0.5, peak_flops_per_s=989.4e12,
                                                  hbm_bytes_per_s=4.8e12),
    memory=cal.MemoryFit(activation_scale=1.0, runtime_bytes=100_000_000.0), tokens_per_s_rel=0.05,
    memory_rel=0.04, fitted_on=("a", "b"), source="hand")


def synthetic_workload(tokens: int, accum: int, fpt: float, static: float) -> cal.Workload:
    return cal.Workload(tokens_per_micro=tokens, micro_steps=accum, world=1, model_flops_per_token=fpt,
                        attn_flops_per_token=0.1 * fpt, vocab=50_000, static_bytes=static,
                        activation_bytes_per_token=300_000.0, logits_bytes_per_token=250_000.0)


def test_fit_recovers_constants_from_synthetic_rows():
    true_t = replace(HAND.throughput, mfu_matmul=0.37, step_overhead_s=0.012)
    true_m = cal.MemoryFit(activation_scale=1.15, runtime_bytes=3e8)
    loads = [synthetic_workload(b * 1024, k, f, s) for b, k, f, s in
             ((8, 1, 8e8, 2e9), (32, 1, 8e8, 2e9), (16, 4, 2.4e9, 6e9), (64, 2, 1.2e9, 3e9))]
    rows = [cal.Row(f"r{i}", "", "fit", "", w, cal.tokens_per_s(w, true_t), cal.peak_memory_bytes(w, true_m) / cal.GIB)
            for i, w in enumerate(loads)]
    t, m = cal.fit_throughput(rows, H200), cal.fit_memory(rows)
    assert t.mfu_matmul == pytest.approx(0.37, rel=1e-9) and t.step_overhead_s == pytest.approx(0.012, rel=1e-9)
    assert m.activation_scale == pytest.approx(1.15, rel=1e-9) and m.runtime_bytes == pytest.approx(3e8, rel=1e-6)
    with pytest.raises(ValueError, match="need >= 2"):
        cal.fit_throughput(rows[:1], H200)


def test_step_time_form_by_hand():
    # 2 micro-steps of 4096 tokens at 1e9 FLOPs/token, a tenth of it attention of which half executes:
    # 0.95e9 / (989.4e12 * 0.43) + 16 * 50,000 / 4.8e12 per token, x 8192 tokens, + 4.5 ms.
    w = synthetic_workload(4096, 2, 1e9, 0.0)
    per_token = 0.95e9 / (989.4e12 * 0.43) + 16 * 50_000 / 4.8e12
    assert cal.step_time_s(w, HAND.throughput) == pytest.approx(8192 * per_token + 0.0045, rel=1e-12)
    assert cal.tokens_per_s(w, HAND.throughput) == pytest.approx(8192 / (8192 * per_token + 0.0045), rel=1e-12)
    chunked = replace(w, loss_bytes_scale=6 / 16)  # the chunked loss: 6 bytes a logit instead of 16
    assert cal.step_time_s(chunked, HAND.throughput) == pytest.approx(
        8192 * (per_token - 10 * 50_000 / 4.8e12) + 0.0045, rel=1e-12)


def test_interval_half_width_is_the_worst_held_out_error_and_covers_every_held_out_row():
    mk = lambda key, role, ratio: cal.RowScore(key, role, ratio * 100.0, 100.0, ratio, 1.0, 1.0, 1.0)  # noqa: E731
    scores = [mk("f", "fit", 1.30), mk("a", "held-out", 0.93), mk("b", "held-out", 1.05), mk("c", "held-out", 1.0)]
    e = cal.held_out_half_width(scores, "tokens_per_s")
    assert e == pytest.approx(0.07)             # the fitted row's 30% does not count
    for s in scores[1:]:
        lo, hi = cal.interval(s.tokens_per_s_predicted, e)
        assert lo <= s.tokens_per_s_measured <= hi
    assert cal.interval(93.0, 0.07) == pytest.approx((93.0 / 1.07, 100.0))   # the worst row sits on the edge


def test_calibrated_prediction_for_a_held_out_row_equals_hand_computation():
    # 124M at B=32, T=1024 on one H200 (held out in the committed calibration), with HAND's constants.
    cfg = load_pretrain_config(None, [*GPT2_124M, "train.micro_batch_size=32"])
    p = predict(cfg, 1, "h200", calibration=HAND)
    # executed FLOPs/token = 855,383,040 - 113,246,208 / 2 = 798,759,936
    per_token = 798_759_936 / (989.4e12 * 0.43) + 16 * 50_257 / 4.8e12       # 2.0450e-6 s
    tps = 32_768 / (32_768 * per_token + 0.0045)                              # 458,225 tokens/s
    assert p.throughput.model == "calibrated" and p.throughput.tokens_per_s == pytest.approx(tps, rel=1e-12)
    assert (p.throughput.tokens_per_s_low, p.throughput.tokens_per_s_high) == pytest.approx((tps / 1.05, tps / 0.95))
    assert p.throughput.assumed_mfu == pytest.approx(tps * 855_383_040 / 989.4e12)
    # static: 12 N + the tied embedding's gradient 4 * 50,304 * 768 = 1,493,710,848 + 154,533,888 = 1,648,244,736;
    # per token: activations 12 x (768 x 36 + 4 x 12) + 768 x 6 = 336,960; logits 2 x 50,304 + 4 x 50,257 = 301,636
    mem = 1_648_244_736 + 100_000_000 + 32_768 * (336_960 + 301_636)           # 22,673,758,464 B = 21.12 GiB
    assert p.memory.model == "calibrated" and p.memory.total_bytes == mem
    assert (p.memory.total_bytes_low, p.memory.total_bytes_high) == (int(mem / 1.04), int(mem / 0.96))


def test_accumulation_ddp_and_fsdp2_static_bytes():
    n = 124_475_904
    accum = workload(load_pretrain_config(None, [*GPT2_124M, "train.micro_batch_size=64",
                                                 "train.total_batch_tokens=524288"]), 1)
    assert accum.micro_steps == 8 and accum.static_bytes == 16 * n          # every gradient alive while accumulating
    ddp = workload(load_pretrain_config(None, [*GPT2_124M, "train.micro_batch_size=64",
                                               "train.total_batch_tokens=524288"]), 2)
    assert ddp.micro_steps == 4 and ddp.static_bytes == 16 * n + 4 * n     # + DDP's gradient buckets
    fsdp = workload(load_pretrain_config(None, [*GPT2_124M, "train.micro_batch_size=64", "train.parallel=fsdp2",
                                                "train.total_batch_tokens=524288"]), 2)
    assert fsdp.static_bytes == 4 * n // 2 + 4 * n // 2 + 8 * n // 2       # ZeRO-3 shards, no buckets


def test_h100_transfer_and_what_falls_back_to_priors():
    h100 = cal.for_hardware(HAND, get_hardware("h100-sxm"))
    assert h100.throughput.mfu_matmul == 0.43 and h100.throughput.step_overhead_s == 0.0045
    assert h100.throughput.hbm_bytes_per_s == 3.35e12 and "transferred from h200" in h100.note
    assert cal.for_hardware(HAND, get_hardware("l40s")) is None
    cfg = load_pretrain_config(None, GPT2_124M)
    assert predict(cfg, 1, "h100-sxm", calibration=HAND).throughput.model == "calibrated"
    l40s = predict(cfg, 1, "l40s", calibration=HAND).throughput
    assert l40s.model == "prior" and "not transferable to l40s" in l40s.mfu_why
    for extra in ("train.compile=false", "train.fp8=all", "train.dtype=float32"):
        p = predict(load_pretrain_config(None, [*GPT2_124M, extra]), 1, "h200", calibration=HAND)
        assert p.throughput.model == p.memory.model == "prior"
    assert predict(cfg, 1, "h200", mfu=0.3, calibration=HAND).throughput.assumed_mfu == 0.3


def test_recipe_fit_recovers_u_at_the_bf16_overhead_and_scores_its_held_out_rows():
    true_t = replace(HAND.throughput, mfu_matmul=0.52)
    w = replace(synthetic_workload(131_072, 4, 8.5e8, 2e9), loss_bytes_scale=6 / 16)
    row = lambda key, role, f: cal.Row(key, "", role, "", w, cal.tokens_per_s(w, true_t) * f, None)  # noqa: E731
    noisy = [row("a", "fit", 0.98), row("b", "fit", 1.02)]   # +-2% around the form: least squares lands near 0.52
    assert cal.fit_recipe_mfu(noisy, HAND.throughput) == pytest.approx(0.52, rel=1e-3)
    rows = [row("f", "fit", 1.0), row("h", "held-out", 1.05), row("s", "stale", 0.5)]
    fit, scores = cal.calibrate_recipe(rows, HAND, "fp8-row")
    assert fit.family == "fp8-row" and fit.fitted_on == ("f",) and fit.mfu_matmul == pytest.approx(0.52, rel=1e-12)
    # the held-out row runs 5% faster than the form: |1/1.05 - 1|; the stale row counts neither way
    assert fit.tokens_per_s_rel == pytest.approx(1 - 1 / 1.05, rel=1e-9)
    assert [s.tokens_per_s_ratio for s in scores] == pytest.approx([1.0, 1 / 1.05, 2.0])
    with pytest.raises(ValueError, match="no rows"):
        cal.fit_recipe_mfu([], HAND.throughput)


RECIPE = ["train.micro_batch_size=256", "train.total_batch_tokens=524288", "train.loss_chunks=16"]


def test_fp8_row_recipe_prediction_by_hand_and_other_fp8_on_the_prior():
    c = replace(HAND, recipes=(cal.RecipeFit("fp8-row", 0.52, 0.07, ("r4", "r5")),))
    cfg = load_pretrain_config(None, [*GPT2_124M, *RECIPE, 'train.fp8="all"', 'train.fp8_scaling="row"'])
    p = predict(cfg, 1, "h200", calibration=c)
    # per token: 798,759,936 / (989.4e12 x 0.52) + 16 x 6/16 x 50,257 / 4.8e12 = 1.55250e-6 + 6.2821e-8 s;
    # 2 micro-steps of 262,144 tokens + 4.5 ms = 0.85134 s a step
    per_token = 798_759_936 / (989.4e12 * 0.52) + 6 * 50_257 / 4.8e12
    tps = 524_288 / (524_288 * per_token + 0.0045)
    assert p.throughput.model == "calibrated" and p.throughput.tokens_per_s == pytest.approx(tps, rel=1e-12)
    assert (p.throughput.tokens_per_s_low, p.throughput.tokens_per_s_high) == pytest.approx((tps / 1.07, tps / 0.93))
    assert "fp8-row recipe family" in p.throughput.mfu_why and p.memory.model == "prior"
    tensor = predict(load_pretrain_config(None, [*GPT2_124M, *RECIPE, 'train.fp8="all"']), 1, "h200", calibration=c)
    why = "calibrated for bf16, fp8-row; this run is fp8-all-tensor-chunked"
    assert tensor.throughput.model == "prior" and why in tensor.throughput.mfu_why
    assert cal.calibration_from_dict(cal.calibration_to_dict(c), "x").recipes == c.recipes
    unchunked = load_pretrain_config(None, [*GPT2_124M, 'train.fp8="all"', 'train.fp8_scaling="row"'])
    assert predict(unchunked, 1, "h200", calibration=c).throughput.model == "prior"   # outside the measured family


# ---------------------------------------------------------------------------------------------
# the ladder


def fake_data_dir(tmp: Path) -> Path:
    data = tmp / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"format": "test", "seed": 1}))
    return data


def test_ladder_file_feeds_the_loss_law_on_the_same_data_only(tmp_path, monkeypatch):
    from scalelab.pretrain.shards import manifest_hash
    data = fake_data_dir(tmp_path)
    true = ScalingLaw(E=1.9, A=300.0, B=900.0, alpha=0.32, beta=0.3, rel_interval=0.0, source="synthetic")
    points = [{"name": f"n{n:.0f}-d{d:.0f}", "n_params": n, "tokens": d, "final_val_loss": true.loss(n, d)}
              for n in np.geomspace(1e7, 1.2e8, 4) for d in np.geomspace(4e6, 1.6e7, 3)]
    ladder = tmp_path / "ladder.json"
    write_json(ladder, {"data_manifest_sha256": manifest_hash(data), "points": points})
    monkeypatch.setattr(predict_mod, "LADDER_PATH", ladder)
    cfg = load_pretrain_config(None, [*GPT2_124M, f"data.dir={json.dumps(str(data))}", "train.max_steps=1000",
                                      "train.micro_batch_size=64"])  # D = 65.5M tokens
    loss = predict(cfg, 1, "h200", calibration=None).loss
    assert loss.law.source.startswith("local ladder fit") and "12 runs" in loss.law.source
    assert loss.final_loss == pytest.approx(true.loss(loss.n_params, loss.train_tokens), rel=1e-3)
    other = load_pretrain_config(None, [*GPT2_124M, "data.dir=\"/nonexistent\""])
    assert "other data" in default_loss_law(other).source and default_loss_law(other).E == 1.69
    write_json(ladder, {"data_manifest_sha256": manifest_hash(data), "points": points[:4]})
    assert "the fit needs >= 5" in default_loss_law(cfg).source


def make_ladder_run(root: Path, name: str, layers: int, width: int, steps: int, done: int, loss: float) -> None:
    from scalelab.core.config import dump_toml
    cfg = load_pretrain_config(None, [f"model.n_layer={layers}", f"model.n_embd={width}", "model.n_head=2",
                                      "model.block_size=64", f"train.max_steps={steps}"])
    (root / name).mkdir(parents=True)
    dump_toml(cfg, root / name / "config.toml")
    write_json(root / name / "train_summary.json", {"steps": done, "tokens": done * 1024, "final_val_loss": loss})
    write_json(root / name / "provenance.json", {"data_manifest_sha256": "abc"})


def test_collect_ladder_keeps_finished_runs_and_merges(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_GIT_SHA", "f" * 40)   # the commit that collected the ladder, in the file
    root, out = tmp_path / "runs", tmp_path / "ladder.json"
    make_ladder_run(root, "small", 2, 32, 10, 10, 7.5)
    make_ladder_run(root, "cut-off", 2, 64, 10, 6, 7.0)       # killed by the budget: not a point yet
    doc = cal.collect_ladder(root, out)
    assert [p["name"] for p in doc["points"]] == ["small"] and doc["law"] is None
    # N = all parameters but the position table: 50,304 x 32 + 2 x (12 x 32^2 + 13 x 32) + 2 x 32 = 1,635,200
    assert doc["points"][0]["n_params"] == 1_635_200 and doc["points"][0]["tokens"] == 10_240
    assert doc["data_manifest_sha256"] == "abc" and doc["git_sha"] == "f" * 40
    make_ladder_run(tmp_path / "runs2", "other", 2, 64, 10, 10, 7.2)
    doc = cal.collect_ladder(tmp_path / "runs2", out)        # a second call adds, keeping the first's points
    assert [p["name"] for p in doc["points"]] == ["small", "other"]


# ---------------------------------------------------------------------------------------------
# the committed results, config and docs agree with the code


def rounded(obj):
    """Floats to 9 significant digits, so another BLAS's last bits do not count as a stale results file."""
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    return [rounded(v) for v in obj] if isinstance(obj, list) else obj


def test_committed_calibration_is_what_the_bench_computes():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import pretrain_calibration as bench
    finally:
        sys.path.pop(0)
    fresh, committed = bench.document(REPO), read_json(REPO / bench.OUT)
    for key in ("throughput_fit", "memory_fit", "intervals", "fitted_on", "summary", "rows", "predictions",
                "time_to_target", "loss_ladder", "recipe_fits", "recipe_rows", "variants_scored"):
        assert rounded(json.loads(json.dumps(fresh[key]))) == rounded(committed[key]), key
    assert committed["summary"]["tokens_per_s"]["within_10pct"] == committed["summary"]["tokens_per_s"]["held_out"]
    assert set(committed["fitted_on"]).isdisjoint(committed["held_out"])
    fp8_row = committed["recipe_rows"]["fp8-row"]   # the FP8 per-row family: fitted on rounds 4-5, held out 6-7
    held = [r for r in fp8_row if r["role"] == "held-out"]
    assert len(held) >= 10 and all(r["tokens_per_s"]["within_10pct"] for r in held)
    assert all("round6" in r["key"] or "round7" in r["key"] for r in held)


def test_ladder_check_scores_the_run_outside_the_fit():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import pretrain_calibration as bench
    finally:
        sys.path.pop(0)
    run = read_json(REPO / bench.LADDER_CHECK)
    scored = {"predictions": [{"size": "350M", "n_params": 3.5e8, "tokens": 3.3e7, "loss": 4.2,
                               "interval": [4.0, 4.4]}],
              "joint": {"predictions": [{"size": "350M", "n_params": 3.5e8, "tokens": 3.3e7, "loss": 3.9}]}}
    run = {**run, "point": {**run["point"], "n_params": 3.5e8, "tokens": 3.3e7, "final_val_loss": 4.0}}
    (c,) = bench.ladder_checks(run, scored, run["point"]["data_manifest_sha256"])
    assert c["rel_error"] == pytest.approx(0.05) and c["joint_rel_error"] == pytest.approx(-0.025)
    assert c["inside_interval"] and c["final_train_loss"] == run["final_train_loss"]
    outside = {**run, "point": {**run["point"], "final_val_loss": 4.5}}
    assert not bench.ladder_checks(outside, scored, run["point"]["data_manifest_sha256"])[0]["inside_interval"]
    with pytest.raises(ValueError, match="its run is on data"):
        bench.ladder_checks(run, scored, "0" * 64)


def test_config_comments_state_the_committed_time_and_cost():
    text = (REPO / "configs/pretrain/gpt2-124m-fineweb-edu.toml").read_text()
    t = next(x for x in read_json(REPO / "results/h200/pretrain/predictor-calibration/results.json")["time_to_target"]
             if x["bar"] == "llmc_tokens")
    lo, hi = t["hours_interval"]
    assert f"= {t['hours']:.2f} h ({lo:.2f}-{hi:.2f} h" in text
    assert f"= ${t['cost_usd']:.2f} (${t['cost_usd_interval'][0]:.2f}-{t['cost_usd_interval'][1]:.2f})" in text
    assert re.search(rf"{t['tokens_per_s'] / 1e6:.2f}M tokens/s", text)


def test_docs_are_generated_from_the_results(tmp_path):
    from scalelab.pretrain.docs import docs
    out = docs(REPO / "docs/pretrain.toml", tmp_path / "pretrain.md")
    text = out.read_text()
    c = read_json(REPO / "results/h200/pretrain/predictor-calibration/results.json")
    t = next(x for x in c["time_to_target"] if x["bar"] == "llmc_tokens")
    assert f"**{t['hours']:.2f} h**" in text and f"**${t['cost_usd']:.2f}**" in text
    s = c["summary"]["tokens_per_s"]
    assert f"{s['within_10pct']} of {s['held_out']} held-out throughputs" in text
    assert "| cudnn-fp8-all | 1 | 516k | 1.065 |" in text and "**97.8%** scaling" in text
    assert (tmp_path / "figures" / "pretrain_recipe_lr.png").read_bytes()[:4] == b"\x89PNG"
    g = read_json(REPO / "results/h100/pretrain/ttt/stats.json")["grid"]   # time to target: the tuned grid, read right
    assert f"| **6e-4** | **{g['losses'][g['lrs'].index(g['best_lr'])]:.3f}** |" in text and g["best_lr"] == 6e-4
    assert "| cudnn-fp8-all-chunks8-b128-tk | 3 | 578k | 1.193 | 33.7 |" in text               # third round
    v6 = read_json(REPO / "results/h200/pretrain/variants-round6/results.json")
    v7 = read_json(REPO / "results/h200/pretrain/variants-round7/results.json")        # seventh round: the latest verdict
    assert f"**Verdict: {v7['verdict']}.**" in text and v7["verdict"].startswith("met: 656,603 tokens/s")
    assert "| cudnn-fp8row-all-chunks8-b128-tk-fast-mk | 4 | 605k | 1.242 | 42.7 |" in text
    assert "| triton | 221 | 416 | 288 | 142 | 143 | 143 |" in text    # round 4's profiles, round 5's, 6's, 7's
    assert "rounds 3-5 ended -0.0070, -0.0165, -0.0397 off plain, but on different val prefixes" in text
    q = v6["quality"]                                        # the rerun on equal val tokens: both runs scored them
    assert q["scored_on_the_same_tokens"] and len(set(q["val_tokens_scored"].values())) == 1
    assert f"round 5's recipe ends **{q['final_val_diff']:+.4f}** off plain (within 0.02: yes)" in text
    assert "to save 6.5 ms/step, saved 0.9 in an A/B on one GPU" in text          # the hardware-cast tile
    assert "one slow kernel, 130 ms/step)" in text and "7.59 ms in bf16, 4.79 in per-tensor FP8" in text
    assert "added 1.3%" in text   # 605,395 / 597,377 in the same call
    assert "saved 9, 4, 15 ms/step (each, then both) against 26–28, 20–47, 46–76 forecast" in text  # the forecast
    v = c["variants_scored"]["summary"]                           # the recipe variants, scored apart
    assert (v["runs"], v["peak_memory_gib_inside"], v["tokens_per_s_inside"]) == (32, 32, 31)
    assert "32 recipe-variant runs of rounds 2-7: 32 inside in memory, 31 in tokens/s" in text
    fit = c["recipe_fits"][0]                                     # the FP8 per-row family's own u, scored forward
    assert f"has its own u = {fit['mfu_matmul']:.3f} (10 runs of rounds 4-5): 10 of 10 later runs within ±10%" in text
    q7 = v7["quality"]                                       # round 7: the bf16 stream's quality, loader, bf16 A/B
    assert f"with round 7's bf16 residual stream, **{q7['final_val_diff']:+.4f}** (within 0.02: yes)" in text
    assert "from 8.7 to 0.03 ms/step but the step by 1.5 ms (forecast 2.6–8.7)" in text
    assert "at 7.7–31.1 ms/step, saved 36–40 on one machine" in text
    check = c["loss_ladder"]["checks"][0]                                              # the 350M ladder check
    assert f"measured **{check['measured']:.3f}**: inside the interval" in text and check["inside_interval"]
    held = {h["split"]: h["max_abs_error"] for h in c["loss_ladder"]["held_out"]}   # the ladder, scored
    assert f"misses those runs by up to {100 * held['largest D']:+.1f}%" in text
    for name in ("pretrain_ttt.png", "pretrain_ladder.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:4] == b"\x89PNG"
    # the GPU time behind the page, by hand from results/pretrain-gpu-ledger.csv: H100 694 + 1,700 + 1,603 s = 1.11 h;
    # H200 1,646 x 2 GPUs + 1,668 + 1,738 x 2 + 1,800 + 1,779 s = 3.34 h; machine time 12,628 s = 3.51 h; at $2.50
    # and $3.50 an hour, $14.46
    assert ("The 8 whose pretraining time is recorded were charged 3.5 h of machine time = 1.1 H100-hours and 3.3 "
            "H200-hours") in text and "about $14 at the same prices; 3 more" in text
    # the post is ~1,500 words of prose (paths and command lines count as words); the calibration rows, the variant
    # rounds, the 2-GPU scaling and the scaling-law ladder follow it as an appendix
    post, appendix = text.split("\n## Appendix A: ", 1)
    words = lambda md: len(" ".join(line for line in md.splitlines()  # noqa: E731
                                    if not line.startswith(("|", "    ", "!["))).split())   # not tables/figures
    assert 1200 < words(post) < 1800 and words(appendix) < 1400
    assert "## Appendix B: Recipe variants: the speed goal" in appendix and "## Appendix C: One GPU to two" in appendix
    assert "## Appendix D: The scaling-law ladder" in appendix and "Appendix D" in post


def test_docs_render_without_a_time_to_target_folder():
    # a manifest without [ttt] (or before its first call) still renders the loss curve, from the quality check alone
    from dataclasses import replace

    from scalelab.pretrain.docs import load_inputs, render
    text = render(replace(load_inputs(REPO / "docs/pretrain.toml"), ttt=None))
    assert "The longest GPU curve is the variants' quality check (41.9M tokens, val loss 6.32 on ShareGPT)." in text
    assert "## Time to target" not in text and "time to target by the speedrun's rules (not run)" in text
