"""Where a vLLM front end's decode steps go, per engine: time blocked on the engine core's output vs time spent
processing it, so a slow rollout over K colocated engines can be told apart as engine-core bound (the scheduler
and the GPU, in the engine core's process) or front-end bound (this process's Python, K front ends sharing one GIL).

vLLM V1's `LLMEngine.step()` is one front-end step: `engine_core.get_output()` (with the engine core in a child
process: a queue fed by a socket-reading thread that also decodes the message) then `process_outputs` on each
request's new tokens. `StepTrace.attach(llm)` wraps both on that one `vllm.LLM` instance (instance attributes;
vLLM's classes are left alone) and counts, per engine: steps, the outputs they carried (one per running sequence
per step), the seconds inside step() and the part of them inside get_output(), and the first and last step's
times. `summary()` can be read while a call runs (a heartbeat writes it into the case's partial file), so a case
cut by its time limit still shows its rate.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable


@dataclass
class EngineSteps:
    """One engine's front-end steps so far."""
    steps: int = 0
    outputs: int = 0  # request outputs carried by the steps (sequences decoded, summed over steps)
    step_s: float = 0.0  # inside LLMEngine.step
    wait_s: float = 0.0  # of which inside engine_core.get_output
    first_start: float | None = None  # perf_counter at the first step's start
    last_end: float | None = None  # perf_counter at the last finished step's end

    def summary(self) -> dict:
        span = (self.last_end - self.first_start) if self.steps else 0.0
        return {**{k: v for k, v in asdict(self).items() if k not in ("first_start", "last_end")},
                "process_s": self.step_s - self.wait_s,  # the front end's own work: output processing, stats
                "span_s": span,  # first step's start to last step's end: the rest of it is outside step()
                "outside_s": max(span - self.step_s, 0.0),
                "mean_step_ms": 1e3 * self.step_s / self.steps if self.steps else None,
                "outputs_per_s": self.outputs / span if span > 0 else None}


class StepTrace:
    """Front-end step timings of one or more `vllm.LLM` instances (attach each once)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.engines: list[EngineSteps] = []

    def attach(self, llm: Any) -> None:
        """Wrap llm.llm_engine.step and llm.llm_engine.engine_core.get_output; a vLLM without them is refused."""
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if engine is None or core is None or not hasattr(engine, "step") or not hasattr(core, "get_output"):
            raise TypeError(f"{type(llm).__name__}: no llm_engine.step / llm_engine.engine_core.get_output to trace "
                            "(vLLM V1's LLMEngine)")
        rec = EngineSteps()
        self.engines.append(rec)
        engine.step = self._timed_step(engine.step, rec)
        core.get_output = self._timed_get_output(core.get_output, rec)

    def _timed_step(self, step: Callable[[], Any], rec: EngineSteps) -> Callable[[], Any]:
        def traced() -> Any:
            t0 = self.clock()
            if rec.first_start is None:
                rec.first_start = t0
            out = step()
            t1 = self.clock()
            rec.steps += 1
            rec.step_s += t1 - t0
            rec.last_end = t1
            return out
        return traced

    def _timed_get_output(self, get_output: Callable[[], Any], rec: EngineSteps) -> Callable[[], Any]:
        def traced() -> Any:
            t0 = self.clock()
            out = get_output()
            rec.wait_s += self.clock() - t0
            rec.outputs += len(getattr(out, "outputs", None) or ())
            return out
        return traced

    def reset(self) -> None:
        """Zero every engine's counts (in place: the wrappers keep their records), e.g. before a call."""
        for rec in self.engines:
            rec.__init__()

    def summary(self) -> list[dict]:
        return [e.summary() for e in self.engines]


class Heartbeat:
    """`write()` every `every_s` seconds on a daemon thread until stopped (or the process ends)."""

    def __init__(self, write: Callable[[], None], every_s: float):
        self.write, self.every_s = write, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
