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
