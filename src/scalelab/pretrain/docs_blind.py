"""The write-up's section on blind predictions of model sizes never trained here: each folder's predictions.json
(bench/pretrain_blind_predictions.py, committed before any run of those sizes) and, once the runs are in, its
scored.json (bench/pretrain_blind_score.py), so the page shows a prediction beside its measurement only after the
measurement exists.

    blind_section(folders) -> list[str]     heading, one table per GPU folder, the count inside the intervals
    blind_summary(folders) -> str           one sentence for the introduction: the count inside, and the misses
    scored_table(sizes) -> list[str]        a scored.json's rows as a Markdown table (the scorer prints it too)
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Sequence

from scalelab.core.jsonio import is_stored, read_json


def _value(x: float | None, quantity: str, gib_digits: int) -> str:
    if x is None:
        return "not measured"
    return f"{x:,.0f}" if quantity == "tokens/s" else f"{x:.3f}" if "loss" in quantity else f"{x:.{gib_digits}f}"


def scored_table(sizes: list[dict], gib_digits: int = 1, miss: str = "**no**") -> list[str]:
    """scored.json's sizes as Markdown rows: predicted (interval), measured, error, inside; `miss` marks a
    measurement outside its interval (the page bolds it; bench/pretrain_blind_score.py prints it plain)."""
    rows = ["| size | steps run | quantity | predicted (interval) | measured | error | inside |",
            "|---|---:|---|---|---:|---:|---|"]
    for s in sizes:
        steps = f"{s['measured']['steps']}" + ("" if s["measured"]["complete"] else " (cut off)")
        for r in s["rows"]:
            q = r["quantity"]
            v = lambda x: _value(x, q, gib_digits)  # noqa: E731
            err = "—" if r["error"] is None else f"{100 * r['error']:+.1f}%"
            inside = "—" if r["inside"] is None else ("yes" if r["inside"] else miss)
            rows.append(f"| {s['size']} | {steps} | {q} | {v(r['predicted'])} ({v(r['low'])}–{v(r['high'])}) | "
                        f"{v(r['measured'])} | {err} | {inside} |")
    return rows


def _folder_lines(folder: Path, shown: str) -> list[str]:
    pred = read_json(folder / "predictions.json")
    gpu = pred["sizes"][0]["prediction"]["hardware_name"]
    when = datetime.datetime.fromtimestamp(pred["written_unix"], datetime.timezone.utc).strftime("%Y-%m-%d")
    sizes = " and ".join(s["size"] for s in pred["sizes"])
    head = f"**{gpu}** (`{shown}/predictions.json`, {sizes}, written {when} at git {pred['git_sha'][:7]})"
    if not is_stored(folder / "scored.json"):
        return [head + ": not run yet.", ""]
    scored = read_json(folder / "scored.json")
    rows = [r for s in scored["sizes"] for r in s["rows"]]
    measured = [r for r in rows if r["measured"] is not None]
    missing = [f"{s['size']} {r['quantity']}" for s in scored["sizes"] for r in s["rows"] if r["measured"] is None]
    tail = (f"{sum(r['inside'] for r in measured)} of {len(measured)} measured quantities inside their intervals"
            + (f"; not measured: {', '.join(missing)}." if missing else "."))
    return [head + f", scored by `{scored['command']}`:", "", *scored_table(scored["sizes"]), "",
            tail + " " + _loss_reading(scored["sizes"], shown), ""]


def _loss_reading(sizes: list[dict], shown: str) -> str:
    """The loss rows read together: every larger model's measured loss against the one point the law gave them."""
    rows = [(s["size"], r) for s in sizes for r in s["rows"] if "loss" in r["quantity"] and r["measured"] is not None]
    if not rows:
        return ""
    measured = ", ".join(f"{size} {r['measured']:.3f}" for size, r in rows)
    predicted = sorted({f"{r['predicted']:.2f}" for _, r in rows})
    return (f"The loss is the weak side: the ladder's law (fitted up to 124M, whose size term it has spent by then) "
            f"gave every larger size about its data term, {' / '.join(predicted)}, and they measured {measured}: at "
            "this small token budget a larger model learns more slowly per token, which an additive L(N, D) cannot "
            f"express ({shown}/README.md reads each row).")


def blind_section(folders: Sequence[tuple[Path, str]]) -> list[str]:
    """folders: (path, name as the page prints it), each holding predictions.json and, once run, scored.json."""
    if not folders:
        return []
    lines = ["## Blind predictions of sizes never trained here", "",
             "Predicted (the models above and the ladder's law of Appendix D, intervals fixed in advance) and "
             "committed before any run of either size; measured in a later commit. Error = measured / predicted "
             "- 1.", ""]
    for path, shown in folders:
        lines += _folder_lines(path, shown)
    return lines


def blind_summary(folders: Sequence[tuple[Path, str]]) -> str:
    """'5 of 6 measured quantities (774M and 1.5B, NVIDIA H100 ...) inside their intervals; outside: 1.5B final val
    loss (+7.3%)', over the folders already scored; '' when none is."""
    parts = []
    for path, _ in folders:
        if not is_stored(path / "scored.json"):
            continue
        scored = read_json(path / "scored.json")
        rows = [(s["size"], r) for s in scored["sizes"] for r in s["rows"] if r["measured"] is not None]
        misses = [f"{size} {r['quantity']} ({100 * r['error']:+.1f}%)" for size, r in rows if not r["inside"]]
        gpu = read_json(path / "predictions.json")["sizes"][0]["prediction"]["hardware_name"]
        parts.append(f"{sum(r['inside'] for _, r in rows)} of {len(rows)} measured quantities of "
                     f"{' and '.join(s['size'] for s in scored['sizes'])} on one {gpu} inside their intervals"
                     + (f"; outside: {', '.join(misses)}" if misses else ""))
    return "; ".join(parts)
