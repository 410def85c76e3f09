"""A dpo run folder read back from its files alone: the events of its last fresh training, the measured results
beside their predictions, and the battery. The run, its REPORT.md, the sweep report and the docs all read runs here."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from scalelab.core.config import read_toml
from scalelab.core.jsonio import is_stored, read_json
from scalelab.core import numfmt
from scalelab.core.rundir import RunDir
from scalelab.core.tables import table

__all__ = ["BATTERY_JSON", "RunFiles", "first_last", "fmt", "is_run_dir", "load_run", "pct", "pts",
           "results_from_run", "table", "this_training"]

# dpo's write-ups print '-' where nothing was measured
def fmt(value: float | None, spec: str = "{:.3f}") -> str:
    return numfmt.num(value, spec, none="-")


pct = partial(numfmt.pct, none="-")
pts = partial(numfmt.points, none="-")

def first_last(records: list[dict], key: str) -> tuple:
    vals = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return (vals[0], vals[-1]) if vals else (None, None)


def this_training(rd: RunDir, kind: str, include_start_data: bool = False) -> list[dict]:
    """Events of `kind` since the last fresh start (a train_start that resumed nothing): a rerun without a
    checkpoint trains from scratch, and the earlier attempt's events must not mix into its results.
    include_start_data: begin at the 'data' event logged just before that start."""
    events = list(rd.events())
    starts = [i for i, e in enumerate(events) if e["event"] == "train_start" and not e.get("resume_from")]
    first = starts[-1] if starts else 0
    if include_start_data:
        first = max([i for i, e in enumerate(events[:first]) if e["event"] == "data"], default=first)
    return [e for e in events[first:] if e["event"] == kind]


def results_from_run(path: str | Path) -> dict:
    rd = RunDir(path)
    train_logs = [e for e in this_training(rd, "train") if "loss" in e]
    margins, steps = this_training(rd, "margins"), this_training(rd, "step")
    step_s = [e["step_s"] for e in steps[1:]] or [e["step_s"] for e in steps]  # first step pays warm-up
    end = (this_training(rd, "train_end") or [{}])[-1]
    loss0, loss1 = first_last(train_logs, "loss")
    acc0, acc1 = first_last(margins, "reward_accuracy")
    m0, m1 = first_last(margins, "margin_mean")
    return {"loss_first": loss0, "loss_last": loss1, "steps": steps[-1]["step"] if steps else 0,
            "heldout_reward_accuracy_first": acc0, "heldout_reward_accuracy_last": acc1,
            "heldout_margin_mean_first": m0, "heldout_margin_mean_last": m1,
            "drift_abs_logratio_chosen_nats_last": first_last(margins, "drift_abs_logratio_chosen_nats")[1],
            "train_reward_accuracy_last": first_last(train_logs, "rewards_accuracies")[1],
            "step_s_median": statistics.median(step_s) if step_s else None,
            "peak_memory_gib": max((e["peak_memory_gib"] for e in steps), default=None),
            "wall_s": end.get("wall_s"), "adapter_bytes": end.get("adapter_bytes"),
            "predictions": rd.read_optional("predictions.json")}


BATTERY_JSON = Path("battery") / "battery.json"


@dataclass(frozen=True)
class RunFiles:
    path: Path
    config: dict                    # config.toml as written by the run
    results: dict                   # results_from_run below: measured, with predictions.json inside
    train: list[dict]               # "train" events since the last fresh start (TRL's log lines)
    margins: list[dict]             # "margins" events since the last fresh start
    step_s_total: float | None      # summed optimizer-step time
    battery: dict | None            # battery/battery.json
    data: dict | None = None        # the "data" event of the last fresh start: sizes, skips, verifier summary

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        t = self.config.get("train", {})
        return f"{t.get('loss', '?')} β={t.get('beta', '?'):g}" if isinstance(t.get("beta"), (int, float)) \
            else self.name


def is_run_dir(path: Path) -> bool:
    return (path / "config.toml").is_file() and is_stored(path / "metrics.jsonl")


def load_run(run_dir: str | Path) -> RunFiles:
    path = Path(run_dir)
    if not is_run_dir(path):
        raise FileNotFoundError(f"{path}: not a dpo run folder (needs config.toml and metrics.jsonl)")
    rd = RunDir(path)
    steps = this_training(rd, "step")
    data = this_training(rd, "data", include_start_data=True)
    battery = path / BATTERY_JSON
    return RunFiles(path, read_toml(path / "config.toml", "run config"), results_from_run(path),
                    this_training(rd, "train"), this_training(rd, "margins"),
                    sum(e["step_s"] for e in steps) if steps else None,
                    read_json(battery) if is_stored(battery) else None, data[0] if data else None)
