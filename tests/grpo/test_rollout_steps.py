"""bench/rollout_steps.py: a vLLM front end's steps split into waiting on the engine core and processing its output,
on stand-ins with vLLM V1's shape (LLM.llm_engine.step calling llm_engine.engine_core.get_output) and a hand clock;
and the rollout bench's --trace-steps, which keeps each call's split and the call in flight when a case is cut."""
from __future__ import annotations

import argparse
import threading
from types import SimpleNamespace

import pytest

from scalelab.core.jsonio import read_json
from tests.bench_script import load_bench


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Core:
    """get_output takes `wait` seconds and carries `n` request outputs."""
    def __init__(self, clock: Clock, n: int, wait: float):
        self.clock, self.n, self.wait = clock, n, wait

    def get_output(self):
        self.clock.t += self.wait
        return SimpleNamespace(outputs=[object()] * self.n)


class Engine:
    """step = get_output, then `work` seconds of processing (vLLM V1's LLMEngine.step)."""
    def __init__(self, core: Core, clock: Clock, work: float):
        self.engine_core, self.clock, self.work = core, clock, work

    def step(self):
        self.engine_core.get_output()
        self.clock.t += self.work
        return []


def fake_llm(clock: Clock, n: int = 4, wait: float = 0.002, work: float = 0.001):
    return SimpleNamespace(llm_engine=Engine(Core(clock, n, wait), clock, work))


def test_steps_split_into_waiting_and_processing_by_hand():
    steps = load_bench("rollout_steps")
    clock = Clock()
    trace = steps.StepTrace(clock)
    a, b = fake_llm(clock, n=4, wait=0.002, work=0.001), fake_llm(clock, n=2, wait=0.010, work=0.0)
    trace.attach(a)
    trace.attach(b)
    for _ in range(3):
        a.llm_engine.step()
        clock.t += 0.005  # outside step(): the caller's loop
    b.llm_engine.step()
    first, second = trace.summary()
    assert (first["steps"], first["outputs"]) == (3, 12)
    assert first["step_s"] == pytest.approx(0.009) and first["wait_s"] == pytest.approx(0.006)
    assert first["process_s"] == pytest.approx(0.003) and first["mean_step_ms"] == pytest.approx(3.0)
    # span: first step's start to third step's end = 3 x 3 ms + 2 x 5 ms between them
    assert first["span_s"] == pytest.approx(0.019) and first["outside_s"] == pytest.approx(0.010)
    assert first["outputs_per_s"] == pytest.approx(12 / 0.019)
    assert (second["steps"], second["outputs"]) == (1, 2)
    assert second["wait_s"] == pytest.approx(0.010) and second["process_s"] == pytest.approx(0.0)


def test_reset_zeroes_and_the_wrappers_keep_counting():
    steps = load_bench("rollout_steps")
    clock = Clock()
    trace = steps.StepTrace(clock)
    llm = fake_llm(clock, n=3)
    trace.attach(llm)
    llm.llm_engine.step()
    trace.reset()
    assert trace.summary()[0]["steps"] == 0 and trace.summary()[0]["outputs_per_s"] is None
    llm.llm_engine.step()
    llm.llm_engine.step()
    assert (trace.summary()[0]["steps"], trace.summary()[0]["outputs"]) == (2, 6)


def test_an_engine_without_v1_step_is_refused():
    steps = load_bench("rollout_steps")
    with pytest.raises(TypeError, match="llm_engine.step"):
        steps.StepTrace().attach(SimpleNamespace(llm_engine=SimpleNamespace(step=lambda: [])))


def test_heartbeat_writes_until_stopped():
    steps = load_bench("rollout_steps")
    beats, twice = [], threading.Event()

    def write():
        beats.append(1)
        if len(beats) >= 2:
            twice.set()
    beat = steps.Heartbeat(write, 0.01)
    with beat:
        assert twice.wait(30)
    assert not beat._thread.is_alive()  # joined on exit: no write after the call it watched


def bench_args(tmp_path, heartbeat_s: float = 3600.0):
    return argparse.Namespace(out=str(tmp_path / "case.json"), vllm_engines=2, heartbeat_s=heartbeat_s)


def test_traced_generate_keeps_each_calls_split_per_engine(tmp_path):
    bench = load_bench("grpo_rollout_bench")
    clock = Clock()
    llms = [fake_llm(clock, n=5), fake_llm(clock, n=5)]
    multi = bench.MultiColocatedEngine([SimpleNamespace(llm=x) for x in llms], [None, None])

    def generate(prompts, params):  # each sub-engine's LLM.generate steps its engine twice
        for x in llms:
            x.llm_engine.step()
            x.llm_engine.step()
        return "batch"
    args = bench_args(tmp_path)
    call = bench.traced(generate, multi, args)
    assert call([[1]], None) == "batch" and call([[1]], None) == "batch"
    calls = args.step_trace["calls"]
    assert args.step_trace["engines"] == 2 and len(calls) == 2
    assert [e["steps"] for e in calls[1]["engines"]] == [2, 2]  # counted per call, not summed over calls
    assert [e["outputs"] for e in calls[1]["engines"]] == [10, 10]


def test_a_call_cut_by_its_time_limit_leaves_its_steps_in_the_partial_file(tmp_path):
    bench = load_bench("grpo_rollout_bench")
    clock = Clock()
    llm = fake_llm(clock, n=7)
    args = bench_args(tmp_path)
    bench.write_partial(args, {"engines": {"hf": {"tokens_per_s": 1.0}}})

    def generate(prompts, params):
        for _ in range(3):
            llm.llm_engine.step()
        raise KeyboardInterrupt  # timeout -s INT
    call = bench.traced(generate, SimpleNamespace(llm=llm), args)
    with pytest.raises(KeyboardInterrupt):
        call([[1]], None)
    kept = read_json(bench.partial_path(args.out))
    assert kept["engines"]["hf"]["tokens_per_s"] == 1.0  # the baseline written before is still there
    flight = kept["step_trace"]["in_flight"]
    assert flight["engines"][0]["steps"] == 3 and flight["engines"][0]["outputs"] == 21
    assert kept["step_trace"]["calls"] == [] and "switch_interval_s" in kept["provenance"]
