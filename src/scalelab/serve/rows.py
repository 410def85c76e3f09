"""One row of the serving scaling table, shared by the sweep (measured), the analytic model (predicted) and the
report: the same record on both sides, so predicted and measured are compared field by field.

A row is an (engine, TP, batch) point: TP GPUs in one engine instance, "batch" = the closed-loop concurrency
(max requests in flight). Throughput is output tokens/s of the instance; latencies in milliseconds; goodput is the
share of requests meeting the SLO (serve.metrics.meets_slo) and that share times the request rate.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ROW_STATUSES = ("ok", "wont_fit", "failed", "predicted")


@dataclass(frozen=True)
class RowKey:
    engine: str       # "vllm" | "sglang"
    tp: int           # GPUs per instance
    batch: int        # max concurrent requests (closed loop)

    @property
    def label(self) -> str:
        return f"{self.engine} TP={self.tp} batch={self.batch}"


@dataclass(frozen=True)
class RowFigures:
    throughput_tok_s: float        # output tokens/s of the instance
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    goodput_share: float           # of all measured requests, in [0, 1]
    goodput_rps: float
    gpu_hours_per_1m: float        # GPU-hours per 1M output tokens = tp x hours / (output tokens / 1e6)

    @classmethod
    def nan(cls) -> RowFigures:
        return cls(*([math.nan] * len(fields(cls))))


@dataclass(frozen=True)
class Row:
    key: RowKey
    status: str                                   # one of ROW_STATUSES
    figures: RowFigures
    # per-figure spread over repeats: {"throughput_tok_s": {"n":3,"mean":..,"std":..,"min":..,"max":..}, ...}
    spread: dict[str, dict[str, float]] = field(default_factory=dict)
    note: str = ""                                # why N/A, the error, or the model's regime
    provenance: dict[str, Any] = field(default_factory=dict)   # engine flags, command, versions

    def __post_init__(self) -> None:
        if self.status not in ROW_STATUSES:
            raise ValueError(f"row {self.key.label}: status {self.status!r}; allowed: {', '.join(ROW_STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_from_dict(d: dict[str, Any]) -> Row:
    return Row(RowKey(**d["key"]), d["status"], RowFigures(**d["figures"]), d.get("spread", {}),
               d.get("note", ""), d.get("provenance", {}))
