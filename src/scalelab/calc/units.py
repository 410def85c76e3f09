"""Human-readable numbers for tables and sentences (decimal units: 1 GB = 1e9 bytes, as nccl-tests)."""
from __future__ import annotations


def fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


def fmt_s(t: float) -> str:
    if t == 0:
        return "0"
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3)):
        text = f"{t / scale:.3g}"
        if abs(t) < 1e3 * scale and "e" not in text:     # 999.96 ms rounds to "1e+03": say 1 s
            return f"{text} {unit}"
    return f"{t:.3g} s"


def fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"
