"""Markdown tables for write-ups: a header, an alignment row and escaped cells, so a '|' inside a cell (a
variant name, a regex) cannot split a column."""
from __future__ import annotations

from collections.abc import Sequence

LEFT, RIGHT = "---", "---:"


def escape(cell: object) -> str:
    return str(cell).replace("|", "\\|")


def row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(escape(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: Sequence[str] | None = None,
          compact_rule: bool = True) -> list[str]:
    """Markdown lines: header, rule, one line per row. align gives each column's rule (LEFT or RIGHT; default
    LEFT); compact_rule writes '|---|---:|' rather than '| --- | ---: |'."""
    align = list(align) if align is not None else [LEFT] * len(header)
    if len(align) != len(header):
        raise ValueError(f"table: {len(align)} alignments for {len(header)} columns")
    for i, r in enumerate(rows):
        if len(r) != len(header):
            raise ValueError(f"table: row {i} has {len(r)} cells for {len(header)} columns: {list(r)!r}")
    rule = "|" + "|".join(align) + "|" if compact_rule else "| " + " | ".join(align) + " |"
    return ["| " + " | ".join(header) + " |", rule, *(row(r) for r in rows)]
