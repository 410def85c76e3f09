"""A serving sweep folder as the report reads it: its files and the settings they state.

predictions.json (the analytic model's rows, written before the sweep measured them), rows.jsonl (measured rows,
one JSON object per line; the last line of a key wins), config.toml, provenance.json, and table.md when the sweep
wrote one.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from scalelab.core import errors
from scalelab.core.hardware import HARDWARE
from scalelab.core.jsonio import is_stored, iter_jsonl, read_json
from scalelab.serve.config import CostSection
from scalelab.serve.metrics import SLO
from scalelab.serve import prices
from scalelab.serve.prices import ApiPrices, PriceTable, api_prices
from scalelab.serve.rows import Row, row_from_dict


class ReportInputError(errors.DataError, FileNotFoundError):
    """A file the report needs is missing or unreadable; the message names it."""


@dataclass(frozen=True)
class SweepData:
    run_dir: Path
    config: dict
    provenance: dict
    predicted: tuple[Row, ...]
    measured: tuple[Row, ...]
    table_md: str | None
    predicted_open: tuple[Row, ...] = ()    # the open-loop rows' predictions (serve.openloop scores them)


def _need(run_dir: Path, name: str, what: str) -> Path:
    path = run_dir / name
    if not is_stored(path):
        raise ReportInputError(f"{path}: not found; the serving report needs {name} ({what})")
    return path


def _row(d: dict, where: str) -> Row:
    """A Row from JSON, whose NaN figures were written as strings (core.jsonio.json_safe)."""
    try:
        figures = {k: float(v) for k, v in d["figures"].items()}
        return row_from_dict({**d, "figures": figures})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a serving row ({type(e).__name__}: {e})") from None


def read_predicted(run_dir: Path) -> tuple[Row, ...]:
    path = _need(run_dir, "predictions.json", "the analytic model's rows, written before the sweep")
    data = read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of rows (or an object with a 'rows' list)")
    return tuple(_row(d, f"{path} row {i}") for i, d in enumerate(rows))


def open_loop(r: Row) -> bool:
    """A row measured at a request rate (the sweep's rate mode) rather than a fixed concurrency."""
    return r.provenance.get("load", {}).get("mode") == "rate" or r.key.batch < 1


def read_measured(run_dir: Path) -> tuple[Row, ...]:
    """The last row written for each point (a retried failure is replaced by its retry)."""
    path = _need(run_dir, "rows.jsonl", "the measured rows, one JSON object per line")
    last: dict[tuple, Row] = {}
    for i, d in enumerate(iter_jsonl(path), 1):
        r = _row(d, f"{path}:{i}")
        last[(r.key, r.provenance.get("load", {}).get("rate_rps"))] = r
    return tuple(last.values())


def load_sweep(run_dir: str | Path) -> SweepData:
    run_dir = Path(run_dir)
    cfg_path = _need(run_dir, "config.toml", "the sweep's resolved config")
    try:
        config = tomllib.loads(cfg_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{cfg_path}: invalid TOML: {e}") from None
    prov = read_json(_need(run_dir, "provenance.json", "versions, hardware and command of the sweep"))
    table = run_dir / "table.md"
    # closed-loop predictions go through the calibration and its comparisons, open-loop ones through openloop
    # a rate search picks its probes as it goes, so its folder has no predictions.json
    search = is_stored(run_dir / "search.json") and not is_stored(run_dir / "predictions.json")
    everything = () if search else read_predicted(run_dir)
    predicted = tuple(r for r in everything if not open_loop(r))
    return SweepData(run_dir, config, prov if isinstance(prov, dict) else {}, predicted,
                     read_measured(run_dir), table.read_text() if table.is_file() else None,
                     tuple(r for r in everything if open_loop(r)))


# ---------------------------------------------------------------------------------------------
# settings from the config, the provenance and the predictions' own record


def find_key(tree: Any, key: str) -> Any:
    """The value of the first `key` in a nested dict, breadth first; None if absent."""
    level = [tree]
    while level:
        nxt = []
        for node in level:
            if isinstance(node, dict):
                if key in node:
                    return node[key]
                nxt += list(node.values())
        level = nxt
    return None


@dataclass(frozen=True)
class Settings:
    hardware: str
    engines: tuple[str, ...]
    model_name: str
    usd_per_gpu_hour: float
    usd_source: str
    api: ApiPrices                   # the configured API models' prices, or why there are none
    slo: SLO


def _usd(cfg: dict, pred_prov: dict, hardware: str) -> tuple[float, str]:
    cost = cfg.get("cost") if isinstance(cfg.get("cost"), dict) else {}
    for value, where in ((cost.get("usd_per_gpu_hour"), "config.toml [cost] usd_per_gpu_hour"),
                         (find_key(cfg, "usd_per_gpu_hour"), "config.toml usd_per_gpu_hour"),
                         (pred_prov.get("usd_per_gpu_hour"), "predictions.json")):
        if isinstance(value, (int, float)) and value >= 0:     # the config's -1 means "the hardware default"
            return float(value), where
    if hardware in HARDWARE:
        return HARDWARE[hardware].price_per_hour, f"core/hardware.py default for {hardware}"
    return math.nan, "no price found"


def _slo(cfg: dict, pred_prov: dict) -> SLO:
    table = cfg.get("slo") if isinstance(cfg.get("slo"), dict) else find_key(cfg, "slo")
    src = table if isinstance(table, dict) else pred_prov.get("slo", {})
    names = {f.name for f in dataclasses.fields(SLO)}
    return SLO(**{k: float(v) for k, v in (src or {}).items() if k in names})


def _model_name(cfg: dict, pred_prov: dict) -> str:
    m = find_key(cfg, "model")
    if isinstance(m, dict):
        m = m.get("shape") or m.get("name") or m.get("path") or m.get("id")
    return str(m or pred_prov.get("model_spec", {}).get("name", "unknown model"))


def settings(data: SweepData, price_table: PriceTable | Callable[[], PriceTable] | None = None) -> Settings:
    """The sweep's settings; API prices from `price_table`, None = the pinned wheel's (looked up at call time)."""
    pred_prov = data.predicted[0].provenance if data.predicted else {}
    hw = find_key(data.config, "hardware") or find_key(data.config, "gpu") or pred_prov.get("hardware", "unknown")
    hw = hw if isinstance(hw, str) else str(hw.get("name", "unknown")) if isinstance(hw, dict) else str(hw)
    usd, usd_source = _usd(data.config, pred_prov, hw)
    engines = tuple(sorted({r.key.engine for r in data.measured + data.predicted}))
    api = api_prices(api_models(data.config), *token_ratio(data), 
                     table=prices.pinned_table if price_table is None else price_table)
    return Settings(hw, engines, _model_name(data.config, pred_prov), usd, usd_source, api,
                    _slo(data.config, pred_prov))


def api_models(cfg: dict) -> list[str]:
    """[cost] api_models of the sweep's config; the config's default for a sweep written before the key existed."""
    cost = cfg.get("cost") if isinstance(cfg.get("cost"), dict) else {}
    models = cost.get("api_models", CostSection().api_models)
    return [str(m) for m in models] if isinstance(models, list) else []


def token_ratio(data: SweepData) -> tuple[float | None, str]:
    """The workload's input:output token ratio and where it was read: the measured rows' token counts (the
    server's usage), else the requests the predictions were made for (prompt tokens and max_tokens, which are
    the generated lengths only when EOS was ignored)."""
    sums = [r.provenance["tokens"] for r in data.measured if r.status == "ok" and "tokens" in r.provenance]
    out = sum(t["output"] for t in sums)
    if out > 0:
        return sum(t["prompt"] for t in sums) / out, "the measured requests' prompt and output tokens"
    ws = [r.provenance["workload"] for r in data.predicted if "workload" in r.provenance]
    out = sum(w["requests"] * w["output_mean"] for w in ws)
    if out <= 0:
        return None, "not recorded"
    eos = data.config.get("workload", {}).get("ignore_eos", True)
    how = "the generated lengths, EOS ignored" if eos else "upper bounds, EOS honoured"
    return (sum(w["requests"] * w["prompt_mean"] for w in ws) / out,
            f"the requests sent, as predictions.json records them: prompt tokens and max_tokens ({how})")


def gpus_phrase(prov: dict) -> str:
    """"2 x NVIDIA H200" from a provenance's list of GPU names (or its single entry)."""
    gpus = find_key(prov, "gpus") or find_key(prov, "gpu")
    if isinstance(gpus, list) and gpus:
        counts = {g: gpus.count(g) for g in dict.fromkeys(map(str, gpus))}
        return ", ".join(f"{n} x {g}" for g, n in counts.items())
    return str(gpus) if gpus else "GPUs not recorded"


def engine_versions(prov: dict, engines: Sequence[str]) -> str:
    table = find_key(prov, "engine_versions")
    table = table if isinstance(table, dict) else find_key(prov, "packages") or {}
    found = [str(table[e]) for e in engines if isinstance(table, dict) and table.get(e)]
    return ", ".join(found)

