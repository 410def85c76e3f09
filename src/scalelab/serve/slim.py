"""Per-request records stored small enough to commit.

A sweep's requests/*.jsonl hold every inter-token gap of every request (~44 MB for a 7B ladder of 18 repeats). A
committed run folder keeps, per request, everything but the gap list, and in its place the gaps' count and the
quantile the SLO judges (serve.metrics.judged_gap_s, method "higher"), times to 10 us, so that each request's
SLO verdict, TTFT and end-to-end latency recompute (a verdict can change only for a time within 10 us of its
limit); the rows keep the pooled ITL percentiles computed from every gap. MANIFEST.json names each full file by
its sha256 and size (kept outside the repository); a warm-up file, excluded from every figure, only there.

    scalelab serve slim RUN     requests/*.jsonl -> requests-slim/*.jsonl + requests-slim/MANIFEST.json
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from scalelab.core.jsonio import iter_jsonl, write_json
from scalelab.serve.metrics import judged_gap_s

SLIM_DIR = "requests-slim"
DEFAULTS = {"error": "", "usage_reported": True, "warmup": False}   # left out when a record has them


def _t(x: float) -> float:
    return round(float(x), 5)   # 10 us: a verdict can differ only for a time within 10 us of its limit


def slim_record(d: dict[str, Any], quantile: float) -> dict[str, Any]:
    """One request without its gap list; its gap count and judged gap in its place; times to 10 us."""
    out = {k: (_t(v) if isinstance(v, float) else v) for k, v in d.items()
           if k != "itl_s" and not (k in DEFAULTS and v == DEFAULTS[k])}
    gaps = d.get("itl_s", [])
    out["gaps"] = len(gaps)
    if gaps:
        out["gap_judged_s"] = _t(judged_gap_s(gaps, quantile))
    return out


def slim_file(path: Path, quantile: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the slim records, the manifest entry) of one requests file."""
    records = list(iter_jsonl(path))
    data = path.read_bytes()
    entry = {"records": len(records), "full_bytes": len(data), "full_sha256": hashlib.sha256(data).hexdigest()}
    return [slim_record(d, quantile) for d in records], entry


def slim_run(run_dir: str | Path, quantile: float = 0.99) -> Path:
    """Write <run>/requests-slim (records and MANIFEST.json) from <run>/requests, then remove requests/."""
    run_dir = Path(run_dir)
    src, dst = run_dir / "requests", run_dir / SLIM_DIR
    files = sorted(src.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{src}: no requests/*.jsonl to slim")
    dst.mkdir(exist_ok=True)
    manifest = {"quantile_judged": quantile, "files": {}}
    for f in files:
        records, entry = slim_file(f, quantile)
        if not all(r.get("warmup") for r in records):   # a warm-up file is named in the manifest, not kept
            (dst / f.name).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        manifest["files"][f.name] = entry
    write_json(dst / "MANIFEST.json", manifest)
    shutil.rmtree(src)
    return dst


def meets_slo_slim(d: dict[str, Any], ttft_s: float, itl_s: float) -> bool:
    """serve.metrics.meets_slo on a slim record (its judged gap stored in place of the gaps)."""
    return bool(d.get("success", True)) and d["ttft_s"] <= ttft_s and d.get("gap_judged_s", 0.0) <= itl_s
