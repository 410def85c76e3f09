"""Metric sinks. metrics.jsonl is always the source of truth; W&B and TensorBoard mirror it when asked.

Mirroring by following the JSONL file (rather than hooking the trainer) works the same for an
in-process run, a torchrun of N processes, or a finished run replayed afterwards.
W&B honours WANDB_MODE=offline (no network, files under <run>/wandb); the API key, when online,
comes only from the environment (WANDB_API_KEY) and is never logged.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol

from scalelab.core.config import ConfigError
from scalelab.core.jsonio import iter_jsonl


class Sink(Protocol):
    def log(self, record: dict) -> None: ...
    def close(self) -> None: ...


def _scalars(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time_unix")}


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        # lazy: the TensorBoard writer needs torch and the optional tensorboard
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        step = int(record.get("step", 0))
        for k, v in _scalars(record).items():
            self.writer.add_scalar(f"{record.get('event', 'metric')}/{k}", v, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, project: str, name: str, config: dict):
        import wandb  # lazy: wandb is an optional tracker
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config, reinit=True)

    def log(self, record: dict) -> None:
        event = record.get("event", "metric")
        data = {f"{event}/{k}": v for k, v in _scalars(record).items()}
        if data:
            self.run.log(data, step=int(record["step"]) if "step" in record else None)

    def close(self) -> None:
        self.run.finish()


TRACKERS = ("wandb", "tensorboard")


def check_trackers(names: list[str], field: str = "run.trackers") -> None:
    """Refuse an unknown sink name at config load, naming the field and the allowed values."""
    bad = [t for t in names if t not in TRACKERS]
    if bad:
        raise ConfigError(f"config field '{field}': {bad[0]!r} is not a tracker; allowed values: "
                          + ", ".join(repr(t) for t in TRACKERS))


def make_sinks(names: list[str], run_dir: Path, project: str, name: str, config: dict) -> list[Sink]:
    factories = {"tensorboard": lambda: TensorBoardSink(run_dir),
                 "wandb": lambda: WandbSink(run_dir, project, name, config)}
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(f"unknown tracker {unknown[0]!r}; known: {', '.join(factories)}")
    return [factories[n]() for n in names]


class JsonlFollower:
    """Forward each new complete line of metrics.jsonl to the sinks, in a background thread."""

    def __init__(self, path: Path, sinks: list[Sink], poll_s: float = 0.5):
        self.path, self.sinks, self.poll_s = path, sinks, poll_s
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "JsonlFollower":
        self._thread.start()
        return self

    def drain(self) -> int:
        records = list(iter_jsonl(self.path))
        for rec in records[self._seen:]:
            for sink in self.sinks:
                sink.log(rec)
        forwarded = len(records) - self._seen
        self._seen = len(records)
        return forwarded

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.drain()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.drain()
        for sink in self.sinks:
            sink.close()


@contextmanager
def mirrored_metrics(names: list[str], run_dir: Path, metrics_path: Path, project: str, name: str,
                     config: dict) -> Iterator[None]:
    """While the body runs, mirror metrics.jsonl to the named sinks; the last lines are forwarded and the sinks
    closed when it ends, also on an error. No sinks: nothing runs."""
    sinks = make_sinks(names, run_dir, project=project, name=name, config=config)
    follower = JsonlFollower(metrics_path, sinks).start() if sinks else None
    try:
        yield
    finally:
        if follower:
            follower.stop()
