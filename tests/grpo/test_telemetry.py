"""Phase timing and the GPU monitor with a fake NVML sampler and a scripted clock."""
from __future__ import annotations

import time

import pytest
import torch

from scalelab.grpo.telemetry import (GpuMonitor, GpuReading, PhaseTimer, StepTiming, gpu_phase_summary, length_stats,
                                     open_nvml, samples_record)


class FakeNvml:
    """Two GPUs; utilization counts the reads so every sample is distinguishable."""

    def __init__(self):
        self.reads, self.closed = 0, False

    def read(self):
        self.reads += 1
        return [GpuReading(0, float(self.reads), 2**30 * self.reads), GpuReading(1, 50.0, 2**30)]

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_samples_are_tagged_with_the_phase_running_when_taken():
    clock = Clock()
    mon = GpuMonitor(FakeNvml(), hz=20, clock=clock)
    timer = PhaseTimer(mon, clock=clock)
    mon.tick()  # before any phase
    with timer.phase("rollout"):
        clock.t = 0.05
        mon.tick()
        clock.t = 0.10
        mon.tick()
        clock.t = 0.30
    with timer.phase("update"):
        clock.t = 0.35
        mon.tick()
        clock.t = 0.40
    mon.tick()
    samples = mon.drain()
    gpu0 = [(s.t_s, s.phase, s.util_pct) for s in samples if s.gpu == 0]
    assert gpu0 == [(0.0, "other", 1.0), (0.05, "rollout", 2.0), (0.10, "rollout", 3.0), (0.35, "update", 4.0),
                    (0.40, "other", 5.0)]
    assert mon.drain() == []  # drained
    summary = gpu_phase_summary(samples)
    assert summary["rollout"] == {"util_mean_pct": (2 + 3 + 50 + 50) / 4, "mem_max_gib": 3.0, "samples": 4}
    t = timer.timing()
    assert (t.rollout_ms, t.update_ms, t.reward_ms) == (pytest.approx(300.0), pytest.approx(100.0), 0.0)
    assert t.step_ms == pytest.approx(400.0)
    assert samples_record(samples)["phase"][:3] == ["other", "other", "rollout"]


def test_background_thread_samples_at_its_rate_and_stops():
    fake = FakeNvml()
    mon = GpuMonitor(fake, hz=200).start()
    mon.mark("rollout")
    time.sleep(0.25)
    mon.stop()
    n = fake.reads
    samples = mon.drain()
    assert 10 <= n <= 60  # 200 Hz for 0.25 s = 50 nominal; a loaded CPU only delays the thread
    assert len(samples) == 2 * n and {s.phase for s in samples} == {"rollout"}
    time.sleep(0.05)
    assert fake.reads == n and fake.closed  # nothing after stop


def test_without_a_sampler_nothing_is_recorded_and_the_reason_is_kept():
    mon = GpuMonitor(None, reason="no NVML here").start()
    mon.tick()
    mon.stop()
    assert not mon.available and mon.drain() == [] and mon.reason == "no NVML here"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_open_nvml_on_a_cpu_machine_says_why():
    sampler, reason = open_nvml()
    assert sampler is None and ("NVML" in reason or "pynvml" in reason)


def test_overlapped_step_time_and_length_stats():
    t = StepTiming(rollout_ms=600, reward_ms=10, reference_ms=0, old_logprob_ms=0, update_ms=300,
                   weight_sync_ms=20, step_ms=940)
    assert t.overlapped_step_ms == 600  # rollout hides the 340 ms of everything else
    stats = length_stats([1, 2, 3, 4, 10])
    assert (stats["len_mean"], stats["len_p50"], stats["len_max"]) == (4.0, 3.0, 10.0)


def test_unknown_phase_is_an_error():
    with pytest.raises(ValueError, match="known: rollout"):
        with PhaseTimer().phase("generate"):
            pass


def test_decode_prior_hand_value():
    from scalelab.core.hardware import Hardware
    from scalelab.grpo.telemetry import decode_tokens_per_s
    hw = Hardware("x", "x", bf16_tflops=1000.0, fp8_tflops=None, hbm_tb_s=1.0, memory_gib=80, link_gb_s=1,
                  link_latency_us=1, price_per_hour=1, source="test")
    # 1e9 params x 2 bytes / 1e12 B/s = 2 ms per step (compute: 2e9 x 64 / 1e15 = 0.128 ms, not the bound);
    # / efficiency 0.5 = 4 ms, + 1 ms overhead = 5 ms per step for 64 sequences -> 12,800 tokens/s
    assert decode_tokens_per_s(10**9, 2, 64, hw, 0.5, 1.0) == pytest.approx(12_800)
    # 8192 sequences: compute-bound, 2e9 x 8192 / 1e15 = 16.4 ms > 2 ms
    assert decode_tokens_per_s(10**9, 2, 8192, hw, 1.0, 0.0) == pytest.approx(8192 / 0.016384)


@pytest.mark.parametrize("env,expected", [(None, [0, 1, 2]), ("", [0, 1, 2]), ("1", [1]), ("2,0", [2, 0]),
                                          ("0,7", [0]), ("GPU-1a2b", [0, 1, 2])])
def test_nvml_samples_only_the_visible_gpus(env, expected, monkeypatch):
    from scalelab.grpo.telemetry import visible_nvml_indices
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if env is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert visible_nvml_indices(3) == expected
