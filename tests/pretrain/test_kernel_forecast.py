"""bench/pretrain_kernel_forecast.py: the per-step saving of the unmeasured kernels, by hand on a small profile
whose calibrating kernels run at 1 and 4 GB/s."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_script import load_bench

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fc():
    return load_bench("pretrain_kernel_forecast")


def profile(fc, **ms) -> dict:
    kernels = {fc.CE_ROWS: 6.0, fc.HEAD_CAST: 1.0, fc.GELU_FWD: 20.0, fc.GELU_BWD: 30.0, "nvjet_gemm": 99.0} | ms
    return {"tokens_per_step": 1000, "sets": ["train.loss_chunks=1"],
            "top_kernels": [{"name": n + "_7", "ms_per_step": t, "calls_per_step": 1.0} for n, t in kernels.items()]}


def test_forecast_by_hand(fc):
    # one micro-step of 1000 rows, MLP width 1000, vocab 1000 in one chunk: 1e6 elements each
    s = fc.Shapes(rows=1000, hidden=1000, vocab=1000, chunks=1, micro_steps=1, layers=1)
    out = fc.forecast(profile(fc), {"best": {"variant": "x-tk-mk", "tokens_per_s": 10_000.0}}, s)
    # loss kernel: 6e6 bytes in 6 ms = 1 GB/s; the cast: 4e6 bytes in 1 ms = 4 GB/s; untuned low end 0.8 GB/s
    assert out["bandwidth_gb_per_s"] == {"loss_kernel": 1.0, "head_gradient_cast": 4.0, "untuned_low": 0.8}
    gk, tk8 = out["parts"]
    # GELU kernels move 12e6 bytes (5 + 7 per element) in place of 20 + 30 ms: 15, 12 and 3 ms at 0.8, 1 and 4 GB/s
    assert gk["removed_ms"] == 50.0 and gk["saving_ms"] == (35.0, 38.0, 47.0)
    # the cast kernel (1 ms) goes; low end: its 1e6-byte transposed write at 0.8 instead of 1 GB/s, +0.25 ms
    assert tk8["saving_ms"][1:] == (1.0, 1.0) and tk8["saving_ms"][0] == pytest.approx(0.75, abs=0.051)
    assert out["base"]["step_ms"] == 100.0  # 1000 tokens at 10,000 tokens/s
    both = out["forecasts"]["x-tk8-mk-gk"]
    assert both["step_ms"]["centre"] == 61.0 and both["step_ms"]["low"] == 52.0  # 100 - (38 + 1), 100 - (47 + 1)
    assert both["tokens_per_s"]["centre"] == round(1000 / 61.0 * 1e3)
    assert set(out["forecasts"]) == {"x-tk8-mk", "x-tk-mk-gk", "x-tk8-mk-gk"}


def test_missing_kernel_and_other_shapes_are_refused(fc):
    s = fc.Shapes(rows=1000, hidden=1000, vocab=1000, chunks=1, micro_steps=1, layers=1)
    best = {"best": {"variant": "x-tk-mk", "tokens_per_s": 10_000.0}}
    bad = profile(fc)
    bad["top_kernels"] = [k for k in bad["top_kernels"] if not k["name"].startswith(fc.GELU_BWD)]
    with pytest.raises(ValueError, match="0 kernels start with 'triton_red_fused.*gelu_backward'"):
        fc.forecast(bad, best, s)
    with pytest.raises(ValueError, match="not of the shapes forecast here"):
        fc.forecast(profile(fc), best, fc.Shapes())


def test_committed_forecast_is_what_the_script_computes(fc, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert fc.main(["--out", str(tmp_path / "f.json")]) == 0
    fresh, committed = (json.loads(p.read_text()) for p in (tmp_path / "f.json",
                                                            REPO / "results/h200/pretrain/kernel-forecast/results.json"))
    assert fresh["forecasts"] == committed["forecasts"] and fresh["parts"] == committed["parts"]
