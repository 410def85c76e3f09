"""The serve page's figure: the Poisson ladders among the page's open-loop folders, drawn; searches and swaps at the
knee (one rate, or gamma arrivals) left out."""
from __future__ import annotations

from pathlib import Path

from scalelab.serve.docs_figure import ladder_series, plot_ladders
from scalelab.serve.report import analyze
from scalelab.serve.sweepdata import load_sweep

OPEN = Path(__file__).resolve().parents[2] / "results" / "h100" / "serve" / "open-loop-1"


def test_only_the_ladders_are_drawn_each_with_its_rates_in_order(tmp_path):
    folders = ["7b-ladder", "7b-search", "7b-gamma", "7b-eos", "05b-ladder"]
    analyses = [analyze(load_sweep(OPEN / f)) for f in folders]
    series = ladder_series(analyses)
    assert [s.label for s in series] == ["open-loop-1/7b-ladder (vllm)", "open-loop-1/05b-ladder (vllm)"]
    assert [x for x, _ in series[0].points] == [6.0, 16.0, 26.0, 34.0, 40.0, 48.0]
    assert [x for x, _ in series[1].points] == [8.0, 20.0, 35.0, 50.0, 70.0, 95.0]
    assert series[1].points[-1][1].throughput_tok_s > 17_000       # the 0.5B at 95 req/s: 17,727 tok/s
    out = plot_ladders(series, analyses[0].settings.slo, tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
