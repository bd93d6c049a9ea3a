"""Small text helpers shared by the widgets."""

from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"


def short_number(x: float) -> str:
    """Compact but exact enough for a status line: 2.3456, 3.00e-04, 12345."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    ax = abs(x)
    if ax != 0 and (ax < 1e-2 or ax >= 1e5):
        return f"{x:.2e}"
    return f"{x:.4g}"


def bar(fraction: float, width: int) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    return "█" * full + "░" * (width - full)
