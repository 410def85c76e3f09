"""The serving scaling table: rows.jsonl -> table.md, table.csv, table.json.

Markdown columns are fixed (the study's published format, with the load beside the config: a closed loop's
concurrency or an open loop's offered rate, and the request rate achieved); the cells show each row's mean over
repeats, throughput with its standard deviation. N/A rows (won't fit) and failed rows keep their place in the
table with their reason as a footnote. CSV carries the same eight columns as plain numbers plus the key,
status, spreads and $/1M; JSON carries each full Row plus its label and $/1M. Both read back to Rows.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

from scalelab.core.jsonio import iter_jsonl, read_json, write_json
from scalelab.core.numfmt import finite
from scalelab.core.provenance import folder_provenance
from scalelab.serve.rows import Row, RowFigures, RowKey, row_from_dict

COLUMNS = ("Config", "Throughput (tok/s)", "p50 TTFT (ms)", "p99 TTFT (ms)", "p50 ITL (ms)", "p99 ITL (ms)",
           "Goodput @ SLO", "GPU-hours per 1M output tokens")
# The figure behind each numeric column, in column order.
COLUMN_FIGURES = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "goodput_share",
                  "gpu_hours_per_1m")
MD_COLUMNS = (COLUMNS[0], "Load", *COLUMNS[1:])
CSV_EXTRA = ("engine", "tp", "batch", "rate_rps", "arrival_cv", "achieved_rps", "status", "goodput_rps",
             "usd_per_1m_output_tokens",
             *(f"{f}_std" for f in COLUMN_FIGURES), "repeats", "note")


@dataclass(frozen=True)
class TableHeader:
    """What the table is about: printed above it and stored in table.json."""
    hardware_key: str
    hardware_name: str
    model: str
    usd_per_gpu_hour: float
    slo_ttft_s: float
    slo_itl_s: float


# ---------------------------------------------------------------------------------------------
# rows: the latest entry per point wins (a failed row retried on resume replaces its failure)


def rate_rps(row: Row) -> float | None:
    """The open-loop request rate of a row, None for a closed-loop (fixed concurrency) row."""
    load = row.provenance.get("load", {})
    return float(load["rate_rps"]) if load.get("mode") == "rate" else None


def arrival_cv(row: Row) -> float | None:
    """The CV of an open-loop row's inter-arrival gaps (1 = Poisson); None for a closed loop or when not recorded
    (rows written before the CV was: their config's sweep.burstiness says)."""
    cv = row.provenance.get("load", {}).get("cv")
    return float(cv) if cv is not None else None


def achieved_rps(row: Row) -> float:
    """Completed requests/s, mean over repeats (NaN when not recorded)."""
    return float(row.provenance.get("achieved_rps", {}).get("mean", math.nan))


def offered(row: Row) -> str:
    """'closed c=4', 'Poisson λ=2.5 req/s', 'gamma CV=1.41 λ=2.5 req/s', or 'open λ=2.5 req/s' (CV not recorded)."""
    rate = rate_rps(row)
    if rate is None:
        return f"closed c={row.key.batch}"
    cv = arrival_cv(row)
    shape = "open" if cv is None else "Poisson" if abs(cv - 1) < 1e-9 else f"gamma CV={cv:.3g}"
    return f"{shape} λ={rate:g} req/s"


def load_cell(row: Row) -> str:
    """The offered load, and after the arrow the completed requests/s it achieved."""
    got = achieved_rps(row)
    return offered(row) + (f" → {got:.3g} req/s" if math.isfinite(got) else "")


def point_id(row: Row) -> tuple[str, int, int, float | None]:
    return row.key.engine, row.key.tp, row.key.batch, rate_rps(row)


def label(row: Row) -> str:
    rate = rate_rps(row)
    return row.key.label if rate is None else f"{row.key.engine} TP={row.key.tp} rate={rate:g} req/s"


def latest_rows(rows: Iterable[Row]) -> list[Row]:
    """One row per point (the last written), sorted by engine, TP, batch, rate."""
    by_point = {point_id(r): r for r in rows}
    return [by_point[k] for k in sorted(by_point, key=lambda k: (k[0], k[1], k[2], k[3] or 0.0))]


def row_from_json(d: dict[str, Any]) -> Row:
    """row_from_dict for a row read from JSON, where json_safe wrote NaN and inf as strings."""
    def num(v: Any) -> Any:
        return float(v) if isinstance(v, str) else v
    figures = {k: num(v) for k, v in d["figures"].items()}
    spread = {k: {s: num(v) for s, v in sp.items()} for k, sp in d.get("spread", {}).items()}
    return row_from_dict({**d, "figures": figures, "spread": spread})


def read_rows(path: str | Path) -> list[Row]:
    return [row_from_json(d) for d in iter_jsonl(path)]


def usd_per_1m(row: Row, usd_per_gpu_hour: float) -> float:
    return row.figures.gpu_hours_per_1m * usd_per_gpu_hour


# ---------------------------------------------------------------------------------------------
# Markdown


def _cells(row: Row) -> list[str]:
    if row.status in ("wont_fit", "failed"):
        return ["N/A" if row.status == "wont_fit" else "failed"] * (len(COLUMNS) - 1)
    f = row.figures
    std = row.spread.get("throughput_tok_s", {}).get("std", math.nan)
    tput = finite(f.throughput_tok_s, "{:,.1f}") + (f" ± {std:,.1f}" if math.isfinite(std) else "")
    goodput = finite(100 * f.goodput_share, "{:.0f}%")
    if math.isfinite(f.goodput_rps):
        goodput += f" ({f.goodput_rps:.2f} req/s)"
    return [tput, *(finite(x, "{:,.1f}") for x in (f.ttft_p50_ms, f.ttft_p99_ms)),
            *(finite(x, "{:,.2f}") for x in (f.itl_p50_ms, f.itl_p99_ms)),
            goodput, _gpu_hours(f.gpu_hours_per_1m)]


def _gpu_hours(x: float) -> str:
    # spans 1e-2 (a big batch on a fast GPU) to 1e3 (batch 1 on a CPU): three significant digits
    return finite(x, "{:.3g}")


def header_line() -> str:
    return "| " + " | ".join(MD_COLUMNS) + " |"


LOAD_NOTE = ("Load: a closed loop of c requests in flight, or an open loop offered λ requests/s (Poisson, or "
             "gamma-distributed gaps of the CV shown); after the arrow, the completed requests/s achieved. "
             "Throughput: output tokens/s of one instance, mean ± std over repeats; latencies: mean over "
             "repeats of each repeat's percentile; goodput: share of requests meeting the SLO.")


def markdown_row(row: Row, *lead: str) -> str:
    """One row of the Markdown table, after `lead` cells (a docs page's run column)."""
    return "| " + " | ".join([*lead, label(row), load_cell(row), *_cells(row)]) + " |"


def render_markdown(rows: Sequence[Row], head: TableHeader) -> str:
    lines = [f"Hardware: {head.hardware_name} (`{head.hardware_key}`) · model: {head.model} · "
             f"SLO: TTFT ≤ {head.slo_ttft_s * 1000:g} ms, ITL p99 ≤ {head.slo_itl_s * 1000:g} ms per request",
             "", header_line(), "|" + "---|" * len(MD_COLUMNS)]
    notes = []
    for row in rows:
        lines.append(markdown_row(row))
        if row.note:  # why N/A, the error, or the requests that failed in a measured row
            what = {"wont_fit": "N/A", "failed": "failed"}.get(row.status, "note")
            notes.append(f"- {label(row)} — {what}: {row.note.splitlines()[0]}")
    lines += ["", LOAD_NOTE]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


# ---------------------------------------------------------------------------------------------
# CSV and JSON (machine-readable; read back to Rows)


def _csv_record(row: Row, head: TableHeader) -> dict[str, Any]:
    figs = [getattr(row.figures, f) for f in COLUMN_FIGURES]
    rec: dict[str, Any] = dict(zip(COLUMNS, [label(row), *figs]))
    rate = rate_rps(row)
    cv = arrival_cv(row)
    rec.update(engine=row.key.engine, tp=row.key.tp, batch=row.key.batch, rate_rps="" if rate is None else rate,
               arrival_cv="" if cv is None else cv, achieved_rps=achieved_rps(row), status=row.status,
               goodput_rps=row.figures.goodput_rps,
               usd_per_1m_output_tokens=usd_per_1m(row, head.usd_per_gpu_hour),
               repeats=row.spread.get("throughput_tok_s", {}).get("n", 0), note=row.note)
    for f in COLUMN_FIGURES:
        rec[f"{f}_std"] = row.spread.get(f, {}).get("std", math.nan)
    return rec


def render_csv(rows: Sequence[Row], head: TableHeader) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*COLUMNS, *CSV_EXTRA], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(_csv_record(row, head))
    return buf.getvalue()


def rows_from_csv(text: str) -> list[Row]:
    """The key, status, figures and note of each row (spreads come back only as stds; of the provenance, only the
    load and the achieved rate)."""
    out = []
    for rec in csv.DictReader(io.StringIO(text)):
        figures = dict(zip(COLUMN_FIGURES, (float(rec[c]) for c in COLUMNS[1:])))
        figures["goodput_rps"] = float(rec["goodput_rps"])
        out.append(Row(RowKey(rec["engine"], int(rec["tp"]), int(rec["batch"])), rec["status"],
                       RowFigures(**{f.name: figures[f.name] for f in fields(RowFigures)}), note=rec["note"],
                       provenance=_csv_provenance(rec)))
    return out


def _csv_provenance(rec: dict[str, str]) -> dict[str, Any]:
    """The load and the achieved rate, as the sweep's row provenance holds them."""
    prov: dict[str, Any] = {}
    if rec["rate_rps"]:
        prov["load"] = {"mode": "rate", "rate_rps": float(rec["rate_rps"])}
        if rec.get("arrival_cv"):
            prov["load"]["cv"] = float(rec["arrival_cv"])
    if rec.get("achieved_rps") and math.isfinite(float(rec["achieved_rps"])):
        prov["achieved_rps"] = {"mean": float(rec["achieved_rps"])}
    return prov


def table_json(rows: Sequence[Row], head: TableHeader) -> dict[str, Any]:
    return {"hardware": {"key": head.hardware_key, "name": head.hardware_name}, "model": head.model,
            "usd_per_gpu_hour": head.usd_per_gpu_hour, "slo": {"ttft_s": head.slo_ttft_s, "itl_s": head.slo_itl_s},
            "columns": list(COLUMNS),
            "rows": [{"config": label(r), "usd_per_1m_output_tokens": usd_per_1m(r, head.usd_per_gpu_hour),
                      **r.to_dict()} for r in rows]}


def rows_from_table_json(data: dict[str, Any]) -> list[Row]:
    return [row_from_json(d) for d in data["rows"]]


def write_tables(run_dir: Path, rows: Sequence[Row], head: TableHeader) -> dict[str, Path]:
    paths = {"md": run_dir / "table.md", "csv": run_dir / "table.csv", "json": run_dir / "table.json"}
    paths["md"].write_text(render_markdown(rows, head))
    paths["csv"].write_text(render_csv(rows, head))
    write_json(paths["json"], {**table_json(rows, head), "provenance": folder_provenance(run_dir)})
    return paths


def read_table_json(run_dir: Path) -> list[Row]:
    return rows_from_table_json(read_json(run_dir / "table.json"))
