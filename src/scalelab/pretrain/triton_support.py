"""The triton import the kernel files share (ce_kernel.py, fp8_kernels.py), and the check before a launch.

Without the triton package (CPU-only installs) the trainer still imports; asking for a kernel is then an error
naming the option. TRITON_INTERPRET=1, set before this import, runs the kernels on CPU in Triton's interpreter
(the tests do; Triton wraps its own library functions when it is imported)."""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the trainer imports; the kernels are refused when asked for
    triton = tl = None


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read once, as triton itself reads it at import


def require_triton(t: torch.Tensor, option: str, instead: str) -> None:
    """Refuse, naming the option and its alternative, where the kernels cannot run on t: no triton package, or
    a tensor off CUDA without the interpreter."""
    if triton is None:
        raise RuntimeError(f"{option} needs the triton package (CUDA builds of torch bring it)")
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{option} runs on CUDA, not on {t.device}; use {instead} (or TRITON_INTERPRET=1 to "
                           "interpret the kernel, slowly)")
