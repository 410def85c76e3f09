"""Accelerator table used by every predictor: peak rates, memory, interconnect and a default price.

Peak rates are dense (no 2:4 sparsity) tensor-core numbers from the vendors' datasheets. Interconnect
bandwidth is per GPU per direction (NVLink 4 on H100/H200: 18 links x 25 GB/s = 450 GB/s each way,
marketed as 900 GB/s bidirectional). Prices are typical on-demand cloud rates and only a default:
every job lets the user set `price_per_gpu_hour`.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MfuAssumption:
    """An assumed model-FLOPs utilization with its interval and where it comes from (measured, lead, guess):
    each job's predictor keeps a table of these per hardware key."""
    mfu: float
    mfu_low: float
    mfu_high: float
    why: str


@dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    bf16_tflops: float          # dense peak, TFLOP/s
    fp8_tflops: float | None    # dense peak, TFLOP/s; None = no fp8 tensor cores
    hbm_tb_s: float             # device memory bandwidth, TB/s
    memory_gib: float           # device memory, GiB
    link_gb_s: float            # GPU-to-GPU bandwidth per direction, GB/s (NVLink, else PCIe)
    link_latency_us: float      # small-message collective latency, microseconds
    price_per_hour: float       # default USD per GPU-hour
    source: str

    @property
    def bf16_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


HARDWARE: dict[str, Hardware] = {h.key: h for h in [
    Hardware("h100-sxm", "NVIDIA H100 SXM 80GB", 989.4, 1978.9, 3.35, 80 * 1e9 / 2**30, 450.0, 10.0, 2.50,
             "NVIDIA H100 datasheet (SXM5), dense"),
    Hardware("h200", "NVIDIA H200 SXM 141GB", 989.4, 1978.9, 4.8, 141 * 1e9 / 2**30, 450.0, 10.0, 3.50,
             "NVIDIA H200 datasheet (SXM), dense; same compute as H100"),
    Hardware("a100-80gb", "NVIDIA A100 SXM 80GB", 312.0, None, 2.039, 80 * 1e9 / 2**30, 300.0, 10.0, 1.80,
             "NVIDIA A100 datasheet (SXM4 80GB), dense; NVLink 3 600 GB/s bidirectional"),
    Hardware("l40s", "NVIDIA L40S 48GB", 362.05, 733.0, 0.864, 48 * 1e9 / 2**30, 32.0, 15.0, 1.00,
             "NVIDIA L40S datasheet, dense; no NVLink: PCIe Gen4 x16 ~32 GB/s each way"),
    # A laptop/CI-class CPU: 2 cores x 3 GHz x 32 fp32 FLOP/cycle (2 AVX2 FMA units). Nominal: CPU
    # training reaches a small share of it, which is why predictions on CPU state a low MFU.
    Hardware("cpu", "CPU (2 cores, AVX2)", 0.192, None, 0.02, 24.0, 10.0, 50.0, 0.10,
             "nominal 2-core AVX2 peak; memory bandwidth is a typical DDR4 channel"),
]}


def get_hardware(key: str) -> Hardware:
    if key not in HARDWARE:
        raise KeyError(f"unknown hardware {key!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[key]


def detect_hardware() -> Hardware:
    """The table entry for the first visible GPU, else the CPU entry."""
    try:
        import torch  # lazy: torch takes seconds to import, and this module is used without it
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0).lower()
            for needle, key in (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80gb"), ("l40s", "l40s")):
                if needle in name:
                    return HARDWARE[key]
    except ImportError:
        pass
    return HARDWARE["cpu"]


def resolve_hardware(key: str, device_type: str | None = None) -> Hardware:
    """A table key as given; 'auto' = the CPU entry when the run is on the CPU, else the detected device."""
    if key != "auto":
        return get_hardware(key)
    return HARDWARE["cpu"] if device_type == "cpu" else detect_hardware()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo), else platform.processor(). Recorded because a small
    model's server is bound by its host's CPU (tokenizing, scheduling, streaming every token): the same GPU
    on another host can serve it at another rate."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor()


def host_description() -> dict:
    """What provenance records about the machine, whatever the accelerator."""
    info = {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "cpu_model": cpu_model()}
    try:
        info["cpu_count"] = os.cpu_count()
        import torch  # lazy: torch takes seconds to import, and this module is used without it
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    return info
