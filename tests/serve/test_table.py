"""The scaling table from hand-made rows: exact Markdown, N/A and failed rows, CSV and JSON round trips."""
from __future__ import annotations

import json
import math

from scalelab.core.jsonio import append_jsonl, json_safe, write_json
from scalelab.serve.rows import Row, RowFigures, RowKey
from scalelab.serve.table import (
    TableHeader, header_line, label, latest_rows, read_rows, render_csv, render_markdown, rows_from_csv,
    rows_from_table_json, table_json, write_tables,
)

HEAD = TableHeader("h200", "NVIDIA H200 SXM 141GB", "qwen2.5-72b", 3.5, 2.0, 0.1)
HEADER = ("| Config | Load | Throughput (tok/s) | p50 TTFT (ms) | p99 TTFT (ms) | p50 ITL (ms) | p99 ITL (ms) "
          "| Goodput @ SLO | GPU-hours per 1M output tokens |")
CSV_HEADER = ("Config,Throughput (tok/s),p50 TTFT (ms),p99 TTFT (ms),p50 ITL (ms),p99 ITL (ms),Goodput @ SLO,"
              "GPU-hours per 1M output tokens")


def ok_row(tp: int, batch: int, tput: float, std: float = 12.5) -> Row:
    # GPU-hours per 1M output tokens = tp / (tput x 3600) x 1e6
    figs = RowFigures(tput, 45.25, 120.0, 21.125, 40.0, 0.875, 1.5, tp * 1e6 / (tput * 3600))
    spread = {"throughput_tok_s": {"n": 3, "mean": tput, "std": std, "min": tput - std, "max": tput + std}}
    return Row(RowKey("vllm", tp, batch), "ok", figs, spread, "", {"load": {"mode": "closed", "concurrency": batch},
                                                                   "achieved_rps": {"mean": 1.75}})


def rows() -> list[Row]:
    return [
        Row(RowKey("vllm", 1, 1), "wont_fit", RowFigures.nan(), note="won't fit: 145 GB of weights > 127 GB"),
        ok_row(2, 16, 1234.5),
        Row(RowKey("vllm", 4, 64), "failed", RowFigures.nan(), note="server exited with code 1; log tail:\nOOM"),
    ]


def test_markdown_header_is_the_published_one():
    assert header_line() == HEADER
    lines = render_markdown(rows(), HEAD).splitlines()
    assert lines[0].startswith("Hardware: NVIDIA H200 SXM 141GB (`h200`) · model: qwen2.5-72b")
    assert lines[2] == HEADER
    assert lines[3] == "|---|---|---|---|---|---|---|---|---|"


def test_markdown_cells_na_and_failed_rows():
    md = render_markdown(rows(), HEAD)
    # 2 GPUs / (1234.5 tok/s x 3600 s/h) x 1e6 tokens = 0.450 GPU-hours
    assert ("| vllm TP=2 batch=16 | closed c=16 → 1.75 req/s | 1,234.5 ± 12.5 | 45.2 | 120.0 | 21.12 | 40.00 | "
            "88% (1.50 req/s) | 0.45 |" in md)
    assert "| vllm TP=1 batch=1 | closed c=1 | N/A | N/A | N/A | N/A | N/A | N/A | N/A |" in md
    assert "| vllm TP=4 batch=64 | closed c=64 | failed | failed | failed | failed | failed | failed | failed |" in md
    assert "- vllm TP=1 batch=1 — N/A: won't fit: 145 GB of weights > 127 GB" in md
    assert "- vllm TP=4 batch=64 — failed: server exited with code 1; log tail:" in md  # first line only
    assert "OOM" not in md


def test_csv_round_trip_keeps_key_status_figures_and_note():
    text = render_csv(rows(), HEAD)
    assert text.splitlines()[0].startswith(CSV_HEADER)
    back = rows_from_csv(text)
    assert [(r.key, r.status, r.note) for r in back] == [(r.key, r.status, r.note) for r in rows()]
    assert back[1].figures == rows()[1].figures
    assert back[1].provenance == {"achieved_rps": {"mean": 1.75}}
    assert all(math.isnan(v) for v in vars(back[0].figures).values())


def test_csv_carries_usd_per_1m_and_std():
    import csv
    import io
    rec = list(csv.DictReader(io.StringIO(render_csv(rows(), HEAD))))[1]
    assert float(rec["usd_per_1m_output_tokens"]) == 3.5 * 2e6 / (1234.5 * 3600)
    assert float(rec["throughput_tok_s_std"]) == 12.5 and rec["repeats"] == "3"


def test_json_round_trip_through_a_file_with_nan(tmp_path):
    data = table_json(rows(), HEAD)
    assert data["columns"][0] == "Config" and len(data["columns"]) == 8
    assert data["hardware"] == {"key": "h200", "name": "NVIDIA H200 SXM 141GB"}
    assert data["rows"][1]["usd_per_1m_output_tokens"] == 3.5 * 2e6 / (1234.5 * 3600)
    write_json(tmp_path / "t.json", data)  # NaN is written as the string "nan"
    back = rows_from_table_json(json.loads((tmp_path / "t.json").read_text()))
    assert back[1] == rows()[1]
    assert back[0].key == rows()[0].key and math.isnan(back[0].figures.throughput_tok_s)


def test_latest_row_per_point_wins_and_rate_rows_get_their_own_label(tmp_path):
    retried = ok_row(4, 64, 5000.0)
    rate = Row(RowKey("vllm", 2, 0), "ok", ok_row(2, 0, 300.0).figures,
               provenance={"load": {"mode": "rate", "rate_rps": 2.5}})
    for r in [*rows(), retried, rate]:
        append_jsonl(tmp_path / "rows.jsonl", json_safe(r.to_dict()))
    latest = latest_rows(read_rows(tmp_path / "rows.jsonl"))
    assert [label(r) for r in latest] == ["vllm TP=1 batch=1", "vllm TP=2 rate=2.5 req/s", "vllm TP=2 batch=16",
                                          "vllm TP=4 batch=64"]
    assert latest[-1].status == "ok"  # the failure was retried


def test_write_tables_writes_all_three(tmp_path):
    paths = write_tables(tmp_path, rows(), HEAD)
    assert sorted(p.name for p in paths.values()) == ["table.csv", "table.json", "table.md"]
    assert HEADER in (tmp_path / "table.md").read_text()


def test_load_column_offered_against_achieved():
    from scalelab.serve.table import load_cell
    figs = ok_row(2, 0, 300.0).figures
    poisson = Row(RowKey("vllm", 2, 0), "ok", figs, provenance={"load": {"mode": "rate", "rate_rps": 4.0, "cv": 1.0},
                                                                "achieved_rps": {"mean": 3.912}})
    bursty = Row(RowKey("vllm", 2, 0), "ok", figs, provenance={"load": {"mode": "rate", "rate_rps": 4.0, "cv": 2.0},
                                                               "achieved_rps": {"mean": 3.5}})
    older = Row(RowKey("vllm", 2, 0), "ok", figs, provenance={"load": {"mode": "rate", "rate_rps": 2.5}})
    assert load_cell(poisson) == "Poisson λ=4 req/s → 3.91 req/s"
    assert load_cell(bursty) == "gamma CV=2 λ=4 req/s → 3.5 req/s"
    assert load_cell(older) == "open λ=2.5 req/s"                   # neither the CV nor the achieved rate recorded
    back = rows_from_csv(render_csv([bursty], HEAD))[0]
    assert back.provenance == bursty.provenance
