"""Per-step measurement of the GRPO loop: phase wall-clock, GPU utilization/memory over time, and summaries.

A step is three measured graphs and their glue:
    rollout (generate) -> reward (verify) -> [reference / old-policy forwards] -> update -> weight sync
`PhaseTimer` times each phase (ms) and marks it for `GpuMonitor`, a background thread that samples NVML
(utilization %, memory used) at `hz` and tags each sample with the phase running when it was taken, so a
report can say e.g. "the GPU sat at 30% during rollout". Without NVML (CPU, no driver) the monitor records
nothing and says why; its thread and marker logic are tested with a fake sampler.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from scalelab.core.hardware import resolve_hardware
from scalelab.grpo.capabilities import resolve_method
from scalelab.grpo.types import StepRecord

PHASES = ("rollout", "reward", "reference", "old_logprob", "update", "weight_sync")


@dataclass(frozen=True)
class StepTiming:
    rollout_ms: float
    reward_ms: float
    reference_ms: float
    old_logprob_ms: float  # pi_old forward, only with IS correction or several updates per batch
    update_ms: float
    weight_sync_ms: float
    step_ms: float  # wall-clock of the whole step, >= the sum of the phases

    @property
    def overlapped_step_ms(self) -> float:
        """Step time if rollout ran concurrently with the rest on other devices (staleness >= 1)."""
        rest = self.step_ms - self.rollout_ms
        return max(self.rollout_ms, rest)


class PhaseTimer:
    """`with timer.phase("rollout"): ...` accumulates ms per phase and marks the phase for the monitor."""

    def __init__(self, monitor: "GpuMonitor | None" = None, clock: Callable[[], float] = time.perf_counter):
        self.monitor, self.clock = monitor, clock
        self.ms: dict[str, float] = {p: 0.0 for p in PHASES}
        self.start_s = clock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.ms:
            raise ValueError(f"phase {name!r}; known: {', '.join(PHASES)}")
        if self.monitor is not None:
            self.monitor.mark(name)
        t0 = self.clock()
        try:
            yield
        finally:
            self.ms[name] += (self.clock() - t0) * 1e3
            if self.monitor is not None:
                self.monitor.mark("other")

    def timing(self) -> StepTiming:
        step_ms = (self.clock() - self.start_s) * 1e3
        return StepTiming(**{f"{p}_ms": self.ms[p] for p in PHASES}, step_ms=step_ms)


# ---------------------------------------------------------------------------------------------
# GPU sampling


@dataclass(frozen=True)
class GpuReading:
    gpu: int
    util_pct: float
    mem_used_bytes: int


@dataclass(frozen=True)
class GpuSample:
    t_s: float  # monitor clock
    gpu: int
    util_pct: float
    mem_used_bytes: int
    phase: str


class Sampler(Protocol):
    def read(self) -> list[GpuReading]: ...
    def close(self) -> None: ...


def visible_nvml_indices(count: int, env: str | None = None) -> list[int]:
    """The NVML indices of this process's GPUs: NVML sees every GPU of the host, so two runs side by side (one per
    GPU via CUDA_VISIBLE_DEVICES) would each record the other's utilization. Integer lists are honoured; UUIDs
    or an unset variable mean every GPU."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    if env is None or not env.strip():
        return list(range(count))
    try:
        picked = [int(x) for x in env.split(",") if x.strip()]
    except ValueError:  # GPU-<uuid> / MIG names: not mapped here
        return list(range(count))
    return [i for i in picked if 0 <= i < count]


class NvmlSampler:
    """nvidia-ml-py: utilization over the driver's last sample period, and memory used, per visible GPU."""

    def __init__(self):
        import pynvml  # lazy: NVML only where there is a GPU
        self.nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in visible_nvml_indices(count)]

    def read(self) -> list[GpuReading]:
        out = []
        for i, h in enumerate(self.handles):
            util = self.nvml.nvmlDeviceGetUtilizationRates(h).gpu
            out.append(GpuReading(i, float(util), int(self.nvml.nvmlDeviceGetMemoryInfo(h).used)))
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def open_nvml() -> tuple[Sampler | None, str]:
    """(sampler, '') when NVML answers with at least one GPU, else (None, why not)."""
    try:
        sampler = NvmlSampler()
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    except Exception as e:  # pynvml raises NVMLError subclasses for a missing driver/library
        return None, f"NVML unavailable ({type(e).__name__}: {e}); no GPU samples recorded"
    if not sampler.handles:
        sampler.close()
        return None, "NVML reports no GPU; no GPU samples recorded"
    return sampler, ""


class GpuMonitor:
    """Samples `sampler` at `hz` in a daemon thread; each sample is tagged with the current phase."""

    def __init__(self, sampler: Sampler | None, hz: float = 20.0, reason: str = "",
                 clock: Callable[[], float] = time.perf_counter):
        self.sampler, self.hz, self.reason, self.clock = sampler, hz, reason, clock
        self.current = "other"
        self.samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-monitor")

    @property
    def available(self) -> bool:
        return self.sampler is not None

    def start(self) -> "GpuMonitor":
        if self.available:
            self._thread.start()
        return self

    def mark(self, phase: str) -> None:
        with self._lock:
            self.current = phase

    def tick(self) -> None:
        """Take one sample now (the thread calls this at hz; tests call it directly)."""
        if self.sampler is None:
            return
        t, readings = self.clock(), self.sampler.read()
        with self._lock:
            self.samples += [GpuSample(t, r.gpu, r.util_pct, r.mem_used_bytes, self.current) for r in readings]

    def _run(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.wait(period):
            self.tick()

    def drain(self) -> list[GpuSample]:
        with self._lock:
            out, self.samples = self.samples, []
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.sampler is not None:
            self.sampler.close()


# ---------------------------------------------------------------------------------------------
# summaries (one metrics.jsonl record per step)


def gpu_phase_summary(samples: Sequence[GpuSample]) -> dict[str, dict[str, float]]:
    """Per phase: mean utilization (%), peak memory (GiB) and sample count, over all GPUs."""
    out: dict[str, dict[str, float]] = {}
    for phase in sorted({s.phase for s in samples}):
        mine = [s for s in samples if s.phase == phase]
        out[phase] = {"util_mean_pct": float(np.mean([s.util_pct for s in mine])),
                      "mem_max_gib": max(s.mem_used_bytes for s in mine) / 2**30, "samples": len(mine)}
    return out


def samples_record(samples: Sequence[GpuSample]) -> dict[str, list]:
    """Columns of a step's samples, compact enough to append to metrics.jsonl every step."""
    return {"t_s": [round(s.t_s, 4) for s in samples], "gpu": [s.gpu for s in samples],
            "util_pct": [s.util_pct for s in samples], "mem_used_bytes": [s.mem_used_bytes for s in samples],
            "phase": [s.phase for s in samples]}


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    a = np.asarray(lengths, dtype=float)
    return {"len_mean": float(a.mean()), "len_p10": float(np.percentile(a, 10)),
            "len_p50": float(np.percentile(a, 50)), "len_p90": float(np.percentile(a, 90)),
            "len_max": float(a.max()), "len_min": float(a.min())}


def step_line(rec: StepRecord) -> str:
    """One concise log line per step (llm.c style)."""
    stage = f" | stage {rec.curriculum.stage}" if rec.curriculum is not None else ""
    entropy = f" | entropy {rec.entropy_mean:.3f}" if rec.entropy_mean is not None else ""
    return (f"step {rec.step:4d}{stage} | reward {rec.reward_mean:.3f} | kl {rec.kl_mean:.4f}{entropy} | "
            f"len {rec.len_mean:.1f} | rollout {rec.rollout_ms:.0f} ms ({rec.rollout_tokens_per_s:.0f} "
            f"tok/s) | update {rec.update_ms:.0f} ms | sync {rec.weight_sync_ms:.0f} ms | "
            f"step {rec.step_ms:.0f} ms")


# ---------------------------------------------------------------------------------------------
# the prior written to predictions.json before step 0

# Bytes/s assumed for each weight-sync method's medium (the prior, not a measurement): in-place copy reads and
# writes device memory; a safetensors sync writes then reads the page cache (~2 GB/s each way for one
# process); an adapter is the same path at adapter size; nccl broadcasts over the GPU link (Hardware.link_gb_s).
SYNC_BYTES_PER_S = {"inplace": None, "safetensors": 1e9, "lora_adapter": 1e9}


@dataclass(frozen=True)
class StepPrediction:
    rollout_tokens_per_s: float
    rollout_ms: float
    reference_ms: float
    update_ms: float
    weight_sync_ms: float
    step_ms: float


def decode_tokens_per_s(n_params: int, bytes_per_param: int, sequences: int, hw: Any, efficiency: float,
                        overhead_ms: float) -> float:
    """Batched decode: each step reads every weight once and does 2 * params FLOPs per sequence, so
    t_step = max(weight bytes / memory bandwidth, 2 * params * B / peak) (Pope et al. 2022) / efficiency,
    plus a fixed per-step overhead (sampling, Python, kernel launches) that dominates for small models."""
    t_step = max(n_params * bytes_per_param / hw.hbm_bytes_s, 2.0 * n_params * sequences / hw.bf16_flops)
    return sequences / (t_step / efficiency + overhead_ms / 1e3)


def predict_step(cfg: Any, policy: Any, prompt_len: float, device_type: str) -> dict:
    """Phase times of one step from the roofline prior and the stated efficiencies (cfg.predict)."""
    hw = resolve_hardware(cfg.run.gpu, device_type)
    params = list(policy.parameters())
    n_params = sum(p.numel() for p in params)
    n_bytes = params[0].element_size()
    p, n_seq = cfg.predict, cfg.sequences_per_step
    # with data.oversample the rollout makes more groups than the update trains on (dynsample.py)
    n_roll = cfg.rollout_prompts_per_step * cfg.rollout.group_size
    gen_len = cfg.rollout.max_new_tokens * p.mean_length_frac
    tok_s = decode_tokens_per_s(n_params, n_bytes, n_roll, hw, p.decode_efficiency, p.decode_step_overhead_ms)
    flops_s = hw.bf16_flops * p.train_mfu
    seq_tokens = n_seq * (prompt_len + gen_len)
    prefill_ms = 2.0 * n_params * n_roll * prompt_len / flops_s * 1e3
    rollout_ms = prefill_ms + n_roll * gen_len / tok_s * 1e3
    rollout_tok_s = n_roll * gen_len / (rollout_ms / 1e3)  # as measured: completion tokens / whole rollout
    # forward 2N FLOPs/token; backward 4N for full weights, ~2N (activation grads only) under LoRA
    per_token = 4.0 if cfg.model.lora.enabled else 6.0
    update_ms = per_token * n_params * seq_tokens * cfg.loss.updates_per_batch / flops_s * 1e3
    reference_ms = 2.0 * n_params * seq_tokens / flops_s * 1e3 if cfg.loss.kl_coef > 0 or cfg.loss.log_kl else 0.0
    method = resolve_method(cfg.rollout.weight_sync, cfg.rollout.engine, cfg.model.lora.enabled)
    rates = {**SYNC_BYTES_PER_S, "nccl": hw.link_gb_s * 1e9}
    rate = None if method == "shared" else rates.get(method) or hw.hbm_bytes_s / 2
    moved = sum(q.numel() * q.element_size() for q in params if q.requires_grad) if method == "lora_adapter" \
        else n_params * n_bytes
    sync_ms = 0.0 if rate is None else moved / rate * 1e3
    pred = StepPrediction(rollout_tok_s, rollout_ms, reference_ms, update_ms, sync_ms,
                          rollout_ms + reference_ms + update_ms + sync_ms)
    return {"step": asdict(pred), "hardware": hw.key, "n_params": n_params, "sequences_per_step": n_seq,
            "prompt_tokens_mean": prompt_len, "completion_tokens_assumed": gen_len, "weight_sync": method,
            "decode_tokens_per_s": tok_s, "prefill_ms": prefill_ms,
            "assumptions": {"decode_efficiency": p.decode_efficiency, "train_mfu": p.train_mfu,
                            "decode_step_overhead_ms": p.decode_step_overhead_ms,
                            "sync_bytes_per_s": rate, "reward_ms": "not predicted (verifier cost is task-specific)"}}
