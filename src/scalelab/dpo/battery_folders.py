"""`scalelab dpo battery <run or sweep>`: which runs, with which config, and the reports after.

A run is evaluated with its own config.toml; `--config FILE` replaces its [battery] table key by key with the
file's, and `--set` overrides any field last. In a sweep every run shares <sweep>/battery-base/, so the base
model is evaluated once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from scalelab.core.config import ConfigError, config_from_dict, parse_override, read_toml
from scalelab.dpo.battery import run_battery
from scalelab.dpo.config import DpoConfig


def _set(data: dict, keys: list[str], value) -> None:
    for k in keys[:-1]:
        data = data.setdefault(k, {})
        if not isinstance(data, dict):
            raise ConfigError(f"override {'.'.join(keys)}: '{k}' is a value, not a table")
    data[keys[-1]] = value


def run_config(run_dir: str | Path, config_file: str | Path | None = None, overrides: Sequence[str] = ()) -> DpoConfig:
    """The run's resolved config with the battery settings of config_file (its [battery] table) and overrides."""
    data = read_toml(Path(run_dir) / "config.toml", "run config")
    origin = f"{Path(run_dir) / 'config.toml'}"
    if config_file is not None:
        extra = read_toml(config_file).get("battery")
        if not isinstance(extra, dict):
            raise ConfigError(f"config file {config_file}: no [battery] table (only that table is used here)")
        data["battery"] = {**data.get("battery", {}), **extra}
        origin += f" + [battery] of {config_file}"
    for text in overrides:
        _set(data, *parse_override(text))
    return config_from_dict(DpoConfig, data, origin + (" + --set" if overrides else ""))


def battery_folder(path: Path, config_file: str | Path | None = None, overrides: Sequence[str] = (),
                   side: str = "both") -> Iterator[tuple[Path, dict | None]]:
    """(run folder, battery.json) for the run at `path` or every run of the sweep at `path`; REPORT.md after each
    run, and the sweep's REPORT.md at the end. With side "base" or "tuned" only that side's records are
    measured (battery.json None, no reports): several such processes can share a sweep, one per GPU."""
    from scalelab.dpo.report import is_run_dir, write_run_report
    from scalelab.dpo.sweep_report import find_runs, write_sweep_report
    single = is_run_dir(path)
    for run in [path] if single else find_runs(path):
        battery = run_battery(run_config(run, config_file, overrides), run, side)
        if battery is not None:
            write_run_report(run)
        yield run, battery
    if not single and side == "both":
        write_sweep_report(path)
