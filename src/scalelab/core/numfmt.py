"""Number formatting for write-ups: one spelling of a percentage, a signed change or a count across every job's
REPORT.md and docs/*.md. None prints as the caller's placeholder (a table cell with nothing measured)."""
from __future__ import annotations

import math

DASH = "—"


def pct(fraction: float | None, digits: int = 1, none: str = DASH) -> str:
    """0.123 -> '12.3%'."""
    return none if fraction is None else f"{100 * fraction:.{digits}f}%"


def signed_pct(fraction: float | None, digits: int = 1, none: str = DASH) -> str:
    """A relative change: 0.012 -> '+1.2%', -0.05 -> '-5.0%'."""
    return none if fraction is None else f"{100 * fraction:+.{digits}f}%"


def points(fraction: float | None, digits: int = 1, none: str = DASH) -> str:
    """A change of a share in percentage points, without the unit: 0.012 -> '+1.2'."""
    return none if fraction is None else f"{100 * fraction:+.{digits}f}"


def thousands(x: float) -> str:
    """A large count in thousands below a million, else millions: 578_400 -> '578k', 1_234_000 -> '1.23M'."""
    return f"{x / 1e3:,.0f}k" if x < 1e6 else f"{x / 1e6:,.2f}M"


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """A value with an SI prefix and `digits` significant figures: si(3.2e9, 'B') -> '3.2 GB'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}".rstrip()
    prefixes = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
    scale, prefix = next(((s, p) for s, p in prefixes if abs(x) >= s), prefixes[-1])
    return f"{x / scale:.{digits}g} {prefix}{unit}".rstrip()


def ms(seconds: float | None, digits: int = 1, none: str = DASH) -> str:
    """Seconds shown in milliseconds: 0.01234 -> '12.3 ms'."""
    return none if seconds is None else f"{1000 * seconds:,.{digits}f} ms"


def num(value: float | None, spec: str = "{:.4g}", none: str = DASH) -> str:
    """A value through a format spec; None (nothing measured) prints as `none`."""
    return none if value is None else spec.format(value)


def finite(value: float, spec: str = "{:.4g}", none: str = "N/A") -> str:
    """A figure through a format spec; NaN or inf (a figure not measured, a row that did not fit) prints as `none`."""
    return spec.format(value) if math.isfinite(value) else none


def nbytes(n: float) -> str:
    """Bytes in decimal units (1 GB = 1e9 B, as nccl-tests), three significant figures, nothing below a byte:
    26.2e6 -> '26.2 MB', 0.5 -> '0.5 B'."""
    return si(n, "B") if abs(n) >= 1 or n == 0 else f"{n:.3g} B"


def seconds(t: float) -> str:
    """A duration in µs, ms or s, whichever keeps three significant figures without an exponent: 2.13e-3 ->
    '2.13 ms', 0 -> '0'."""
    if t == 0:
        return "0"
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3)):
        text = f"{t / scale:.3g}"
        if abs(t) < 1e3 * scale and "e" not in text:     # 999.96 ms rounds to "1e+03": say 1 s
            return f"{text} {unit}"
    return f"{t:.3g} s"
