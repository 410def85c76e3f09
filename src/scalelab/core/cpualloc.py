"""CPU training: glibc's allocator told to keep the memory a step frees for the next step.

By default glibc serves large blocks with mmap and hands them back to the kernel when freed, and trims the heap
top above 128 KiB, so every optimizer step of a CPU run maps, faults in (zero-fills) and unmaps the same
activations again. On the 2-core machine the demo targets that cost 35 s of kernel time in 50 s of a 15-step run
of configs/pretrain/tiny-cpu.toml; with the thresholds below, 9.5 s, and the step 1,378 -> 1,013 ms. The same
settings as environment variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_) are read at
process start; mallopt(3) sets them from inside, before the first step's allocations. Other C libraries: no-op.
SCALELAB_CPU_MALLOPT=0 leaves glibc's defaults (bench/cpu_alloc_ab.py measures the two against each other).
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3   # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20      # glibc's largest (4 * 1024 * 1024 * sizeof(long)): blocks below it come from the heap
TRIM_THRESHOLD = 2 ** 31 - 1   # mallopt takes an int: never trim a freed heap top back to the kernel
TOP_PAD = 1 << 30              # grow the heap in steps of up to 1 GiB, not one page


def keep_freed_memory(device_type: str = "cpu") -> bool:
    """Set the three thresholds for a process that trains on `device_type` (only "cpu" needs them); True when glibc
    accepted all of them."""
    if (device_type != "cpu" or not sys.platform.startswith("linux")
            or os.environ.get("SCALELAB_CPU_MALLOPT") == "0"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)
