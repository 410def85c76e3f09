"""REPORT.md and docs/serve.md from hand-made sweep folders: ratios, roles, cost and errors checked by value."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from scalelab.calc.presets import get_model
from scalelab.core.jsonio import json_safe, write_json
from scalelab.serve.metrics import SLO
from scalelab.serve.prices import PriceError, parse_table
from scalelab.serve.docs import render_docs
from scalelab.serve.model import predict_row
from scalelab.serve.report import write_report
from scalelab.serve.stepmodel import ServeCalibration
from scalelab.serve.sweepdata import ReportInputError, load_sweep
from scalelab.serve.rows import Row, RowFigures, RowKey

CONFIG = """[model]
shape = "qwen2.5-7b"
[engine]
names = ["vllm"]
[slo]
ttft_s = 2.0
itl_s = 0.1
[cost]
hardware = "h200"
usd_per_gpu_hour = 2.0
api_models = ["api-a", "api-b"]
"""
# $1.00 in / $2.00 out and $0.10 in / $0.50 out per 1M tokens
PRICES = parse_table(json.dumps({"api-a": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
                                           "litellm_provider": "prov-a"},
                                 "api-b": {"input_cost_per_token": 1e-07, "output_cost_per_token": 5e-07,
                                           "litellm_provider": "prov-b"}}), "test table")


def figures(thr: float, ttft50: float, ttft99: float, itl50: float, itl99: float, good: float, gpu_h: float
            ) -> RowFigures:
    return RowFigures(thr, ttft50, ttft99, itl50, itl99, good, good, gpu_h)


def predicted(tp: int, batch: int, f: RowFigures) -> Row:
    band = {"throughput_tok_s": {"lo": 0.9 * f.throughput_tok_s, "hi": 1.1 * f.throughput_tok_s}}
    prov = {"calibration": {"fitted_on": [], "source": "priors"}, "interval": "a stated +-10% band"}
    return Row(RowKey("vllm", tp, batch), "predicted", f, band, "decode memory-bound", prov)


def write_folder(folder: Path, measured: list[Row], preds: list[Row], table_md: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "predictions.json", {"written_unix": 0.0, "rows": [r.to_dict() for r in preds]})
    (folder / "rows.jsonl").write_text("".join(json.dumps(json_safe(r.to_dict())) + "\n" for r in measured))
    (folder / "config.toml").write_text(CONFIG)
    write_json(folder / "provenance.json", {"git_sha": "abc123", "hardware": {"gpus": ["NVIDIA H200"] * 2},
                                            "engine_versions": {"vllm": "vllm 0.26.0"}})
    if table_md is not None:
        (folder / "table.md").write_text(table_md)
    return folder


@pytest.fixture
def hand_made(tmp_path: Path) -> Path:
    preds = [predicted(1, 1, figures(100, 50, 80, 10, 12, 1.0, 2.0)),
             predicted(1, 8, figures(1000, 60, 150, 11, 30, 1.0, 0.5)),
             predicted(2, 8, figures(1500, 40, 100, 8, 20, 1.0, 0.4))]
    measured = [Row(RowKey("vllm", 1, 1), "ok", figures(80, 50, 100, 10, 12, 1.0, 2.5)),
                Row(RowKey("vllm", 1, 8), "ok", figures(1000, 75, 150, 11, 24, 0.8, 0.5))]
    return write_folder(tmp_path / "run", measured, preds)


def test_report_ratios_roles_and_cost(hand_made: Path):
    text = write_report(hand_made, PRICES).read_text()
    # throughput 100 vs 80 -> 1.25, outside +-20%; the interval 90-110 misses 80
    assert "| vllm TP=1 batch=1 | prior | Throughput (tok/s) | 100 | 90 – 110 (**no**) | 80 | 1.25 | **no** |" in text
    assert "| vllm TP=1 batch=1 | prior | p99 TTFT (ms) | 80.0 | — | 100.0 | 0.80 | yes |" in text   # 0.80: edge, in
    assert "| vllm TP=1 batch=8 | prior | p50 TTFT (ms) | 60.0 | — | 75.0 | 0.80 | yes |" in text
    assert "| vllm TP=1 batch=8 | prior | p99 ITL (ms) | 30.00 | — | 24.00 | 1.25 | **no** |" in text
    assert "| vllm TP=1 batch=8 | prior | Goodput @ SLO | 100% | — | 80% | 1.25 | **no** |" in text
    # 12 figures (2 rows x 6); misses: TP1b1 throughput, TP1b8 p99 ITL, TP1b8 goodput -> 9 within
    assert "prior rows: 9 of 12 figures within ±20% of measured" in text
    assert "vllm TP=2 batch=8" not in text.split("## Where scaling breaks")[0].split("### Predicted")[1]
    # cost: 0.5 GPU-h x $2 = $1.00; no token ratio recorded, so the APIs' output prices alone:
    # 0.50x api-a ($2.00), 2.00x api-b ($0.50)
    assert ("| Config | Load | GPU-hours per 1M | $ per 1M output tokens | vs api-a ($2.000) | vs api-b ($0.500) |"
            in text)
    assert "| vllm TP=1 batch=8 | closed c=8 | 0.5 | $1.00 | 0.50x | 2.00x |" in text
    assert "The cheapest measured row is vllm TP=1 batch=8: $1.00" in text
    assert "API prices: the price table of test table;" in text and "the output price alone" in text
    assert "not fitted" in text                                       # no model record in these predictions
    assert "2 x NVIDIA H200" in text and "vllm 0.26.0" in text
    png = (hand_made / "figures" / "predicted_vs_measured.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_includes_the_sweep_table_and_reads_nan_rows(tmp_path: Path):
    failed = Row(RowKey("vllm", 2, 1), "wont_fit", RowFigures.nan(), note="won't fit: too big")
    folder = write_folder(tmp_path / "run", [failed], [predicted(2, 1, figures(1, 1, 1, 1, 1, 1, 1))],
                          table_md="| Config | the sweep's own table |\n")
    data = load_sweep(folder)
    assert data.measured[0].status == "wont_fit" and math.isnan(data.measured[0].figures.throughput_tok_s)
    text = write_report(folder).read_text()
    assert "| Config | the sweep's own table |" in text
    assert "No measured row has a prediction made before the sweep." in text


@pytest.mark.parametrize("missing", ["predictions.json", "rows.jsonl", "config.toml", "provenance.json"])
def test_missing_file_is_named(hand_made: Path, missing: str):
    (hand_made / missing).unlink()
    with pytest.raises(ReportInputError, match=missing):
        write_report(hand_made)


def test_docs_from_a_folder(hand_made: Path, tmp_path: Path):
    out = tmp_path / "docs" / "serve.md"
    text = render_docs([hand_made], out, PRICES).read_text()
    assert text.splitlines()[2].startswith(f"_Regenerate with `scalelab serve docs {hand_made} --out {out}`")
    assert "measured TP 1 x batch 1/8 (2 rows)" in text
    # per figure: throughput 100/80 misses, p99 ITL 30/24 misses, goodput 100%/80% misses: 9 of 12
    assert ("| `run` | on file, written before the measurement | 1 of 2 | 2 of 2 | 2 of 2 | 2 of 2 | 1 of 2 | 1 of 2 | "
            "9 of 12 |") in text
    assert "TP=2, TP=4, TP=8: no measured row" in text
    assert "sglang: no measured row" in text
    assert "At batch 8, TP=2 gives 1.50x the output tokens/s of TP=1" in text     # predicted 1500 vs measured 1000
    with pytest.raises(ValueError, match="no sweep folder"):
        render_docs([], tmp_path / "x.md")


def model_made(folder: Path) -> tuple[Path, dict]:
    """A sweep folder at TP 1/2 x batch 1/4/8 (qwen2.5-7b, 2 x batch requests per run): predictions from the model's
    priors, 'measurements' from the model with other constants; and each row's (prompt, output) lengths."""
    m = get_model("qwen2.5-7b")
    rng = np.random.default_rng(0)
    true = ServeCalibration(hbm_eff=0.65, prefill_eff=0.5, overhead_tp1_s=0.004, allreduce_latency_s=15e-6)
    preds, measured, lengths = [], [], {}
    for tp in (1, 2):
        for batch in (1, 4, 8):
            n = 2 * batch
            prompts, outputs = rng.integers(100, 400, 2 * n).tolist(), rng.integers(20, 40, 2 * n).tolist()
            lengths[tp, batch] = (prompts, outputs)
            key = RowKey("vllm", tp, batch)
            preds.append(predict_row(m, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, requests_per_run=n))
            truth = predict_row(m, "h200", key, prompts, outputs, SLO(), 0.9, 2.0, true, requests_per_run=n)
            measured.append(dataclasses.replace(truth, status="ok", spread={}))
    return write_folder(folder, measured, preds), lengths


def test_report_calibrates_on_some_rows_and_scores_the_rest(tmp_path: Path):
    """Predictions from the model's priors, 'measurements' from the model with other constants: the report
    fits the constants on default_fit_labels and the held-out rows come back within +-20%."""
    folder, _ = model_made(tmp_path / "run")
    text = write_report(folder).read_text()
    assert "Fitted on vllm TP=1 batch=1, vllm TP=1 batch=8, vllm TP=2 batch=1; 3 measured vllm row(s) held out" in text
    assert "held-out rows: 18 of 18 figures within ±20%" in text
    assert (folder / "predictions_calibrated.json").is_file()
    assert "Model, batch-1 decode step of qwen2.5-7b" in text


def test_docs_predict_the_unmeasured_tps_and_the_configured_batch_nobody_measured(tmp_path: Path):
    """Measured TP 1/2 at batch 1/4/8, configured batch 32 too: the docs predict TP=4 and TP=8 at every batch, batch
    32 on batch 8's request lengths cycled to 3 repeats of 32 x 2 waves, with the calibration the report fitted."""
    from scalelab.serve.docs import ladder_rows
    from scalelab.serve.report import analyze
    folder, lengths = model_made(tmp_path / "run")
    (folder / "config.toml").write_text(CONFIG + "[sweep]\nbatch = [1, 4, 8, 32]\nwaves = 2\nmin_requests = 4\n")
    a = analyze(load_sweep(folder))
    rows = ladder_rows(a)
    assert [(r.key.tp, r.key.batch) for r in rows] == [(t, b) for b in (1, 4, 8, 32) for t in (4, 8)]
    prompts, outputs = lengths[1, 8]
    cycled = [(prompts * 12)[:192], (outputs * 12)[:192]]            # 3 repeats x 64 requests from 16 lengths
    want = predict_row(get_model("qwen2.5-7b"), "h200", RowKey("vllm", 4, 32), *cycled, SLO(), 0.9, 2.0,
                       a.calibrated.calibration, requests_per_run=64)
    got = next(r for r in rows if (r.key.tp, r.key.batch) == (4, 32))
    assert got.status == want.status == "predicted" and got.figures == want.figures
    batch8 = next(r for r in rows if (r.key.tp, r.key.batch) == (4, 8))
    assert got.figures.throughput_tok_s > batch8.figures.throughput_tok_s          # more in flight, more tokens/s
    text = render_docs([folder], tmp_path / "serve.md").read_text()
    assert "- `run` batch 32: in the sweep's config, measured at no TP" in text and "| vllm TP=4 batch=32 |" in text


def test_predictions_added_after_the_measurement_are_scored_apart(tmp_path: Path):
    late = predicted(1, 8, figures(1000, 60, 150, 11, 30, 1.0, 0.5))
    late = dataclasses.replace(late, provenance={**late.provenance, "added_after_measurement": True,
                                                 "model_commit": "abc123"})
    measured = [Row(RowKey("vllm", 1, 1), "ok", figures(80, 50, 100, 10, 12, 1.0, 2.5)),
                Row(RowKey("vllm", 1, 8), "ok", figures(1000, 75, 150, 11, 24, 0.8, 0.5))]
    folder = write_folder(tmp_path / "run", measured, [predicted(1, 1, figures(100, 50, 80, 10, 12, 1.0, 2.0)), late])
    text = write_report(folder, PRICES).read_text()
    assert "prior rows: 5 of 6 figures within ±20%" in text                      # batch 1: throughput 1.25 misses
    assert "prior (added after the measurement) rows: 4 of 6 figures within ±20%" in text   # p99 ITL, goodput
    assert "(commit abc123) after those rows had been measured" in text
    assert "| vllm TP=1 batch=8 | prior-late | Throughput (tok/s) | 1,000 |" in text


def test_cost_at_the_measured_token_ratio_and_without_a_table(tmp_path: Path):
    """Rows that counted 3 prompt tokens per output token: each API's figure is 3 x input + output."""
    tokens = {"tokens": {"prompt": 3000, "output": 1000}, "achieved_rps": {"mean": 2.5}}
    measured = [Row(RowKey("vllm", 1, 8), "ok", figures(1000, 75, 150, 11, 24, 0.8, 0.5), provenance=tokens)]
    folder = write_folder(tmp_path / "run", measured, [])
    text = write_report(folder, PRICES).read_text()
    # api-a: blended (3 x 1 + 2) / 4 = $1.25, per 1M output tokens 3 x 1 + 2 = $5; api-b: 3 x 0.1 + 0.5 = $0.80,
    # blended 0.8 / 4 = $0.20. The row's $1.00 is 0.20x api-a and 1.25x api-b.
    assert ("| API model | Provider | Input $/1M | Output $/1M | Blended $/1M tokens at 3.00:1 | $ per 1M output "
            "tokens of this workload |") in text
    assert "| api-a | prov-a | $1.000 | $2.000 | $1.250 | $5.000 |" in text
    assert "| api-b | prov-b | $0.100 | $0.500 | $0.200 | $0.800 |" in text
    assert "| vllm TP=1 batch=8 | closed c=8 → 2.5 req/s | 0.5 | $1.00 | 0.20x | 1.25x |" in text
    assert "at the workload's 3.00:1 input:output tokens, from the measured requests' prompt and output tokens" in text

    def offline():
        raise PriceError("price table: wheel litellm==1.110.2: pip download failed (no index)")
    text = write_report(folder, offline).read_text()
    assert ("No API prices are compared: no API prices were read (price table: wheel litellm==1.110.2: pip download "
            "failed (no index)). No other prices are substituted.") in text
    assert "| Config | Load | GPU-hours per 1M | $ per 1M output tokens |\n" in text     # no API column
    assert "$1.00 per 1M output tokens at $2.00/GPU-hour; this holds only" in text


def test_token_ratio_from_the_predictions_when_rows_did_not_count(tmp_path: Path):
    from scalelab.serve.sweepdata import token_ratio
    preds = []
    for batch, n, prompt in ((1, 10, 300.0), (8, 30, 200.0)):
        row = predicted(1, batch, figures(1, 1, 1, 1, 1, 1, 1))
        preds.append(dataclasses.replace(row, provenance={**row.provenance, "workload": {
            "requests": n, "prompt_mean": prompt, "output_mean": 100.0}}))
    folder = write_folder(tmp_path / "run", [], preds)
    # (10 x 300 + 30 x 200) / (10 x 100 + 30 x 100) = 9000 / 4000
    ratio, source = token_ratio(load_sweep(folder))
    assert ratio == pytest.approx(2.25) and "EOS ignored" in source
    (folder / "config.toml").write_text(CONFIG + "[workload]\nignore_eos = false\n")
    assert "upper bounds, EOS honoured" in token_ratio(load_sweep(folder))[1]


def _rate_row(rate: float, share: float, status: str, engine: str = "vllm") -> Row:
    f = figures(1000 * rate, 50, 100 * rate / 10, 10, 20, share, 0.1 / rate)
    return Row(RowKey(engine, 1, 0), status, f, provenance={
        "load": {"mode": "rate", "rate_rps": rate, "cv": 1.0},
        "request_files": f"requests/{engine}-tp1-r{rate:g}-*.jsonl"})


def test_open_loop_ladder_in_its_report_and_in_docs(hand_made: Path, tmp_path: Path):
    """A Poisson ladder: its knee scored in REPORT.md and docs, each request's miss counted, the price taken at
    the highest rate that meets the SLO, and the closed-loop sections left to the closed-loop sweep."""
    shares = {10.0: 1.0, 20.0: 0.95, 30.0: 0.80}
    folder = write_folder(tmp_path / "loop" / "ladder", [_rate_row(r, s, "ok") for r, s in shares.items()],
                          [_rate_row(10.0, 1.0, "predicted"), _rate_row(20.0, 0.85, "predicted"),
                           _rate_row(30.0, 0.5, "predicted")])
    (folder / "requests").mkdir()
    late_and_stalled = [{"ttft_s": 2.5, "itl_s": [0.01] * 10, "success": True},
                        {"ttft_s": 0.1, "itl_s": [0.01] * 9 + [0.3], "success": True},
                        {"ttft_s": 0.1, "itl_s": [0.01] * 10, "success": True}]
    (folder / "requests" / "vllm-tp1-r30-r0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in late_and_stalled))
    report = write_report(folder, PRICES).read_text()
    assert "knee predicted 20 req/s, measured 30 req/s (ratio 0.67, outside ±20%)" in report
    assert "| Poisson λ=30 req/s | 3 | 1 (33%) | 1 (33%) | 0 (0%) | 0 (0%) |" in report
    # highest rate meeting 90%: 20 req/s, 0.1 / 20 = 0.005 GPU-hours, x $2.00
    assert "(Poisson λ=20 req/s, goodput 95%): 0.005 GPU-hours and $0.01 per 1M output tokens" in report
    assert (folder / "figures" / "open_loop_predicted_vs_measured.png").stat().st_size > 1000
    assert not (folder / "figures" / "predicted_vs_measured.png").exists()   # no closed-loop comparison to draw
    text = render_docs([hand_made, folder], tmp_path / "serve.md", PRICES).read_text()
    assert "- `loop/ladder`: vllm TP=1, Poisson ladder up to 30 req/s: knee predicted 20 req/s" in text
    assert "| `loop/ladder` | vllm TP=1 rate=30 req/s |" in text
    assert "| `loop/ladder` | Poisson λ=30 req/s | 3 | 1 (33%) |" in text
    assert "`ladder`:" not in text.split("## Open loop")[0]     # closed-loop sections name the closed sweep only


def test_an_engine_measured_only_in_open_loop_is_not_called_unmeasured(hand_made: Path, tmp_path: Path):
    rows = [_rate_row(r, 1.0, "ok", "sglang") for r in (10.0, 20.0)]
    folder = write_folder(tmp_path / "loop" / "sg", rows, [_rate_row(r, 1.0, "predicted", "sglang") for r in (10.0, 20.0)])
    text = render_docs([hand_made, folder], tmp_path / "serve.md", PRICES).read_text()
    assert "- sglang: no closed-loop (batch) row; its open-loop rows are above." in text
    assert "sglang: no measured row" not in text
