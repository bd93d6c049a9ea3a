"""Small text helpers shared by the widgets."""

from __future__ import annotations

import math

from workbench.units import human_bytes  # noqa: F401 - re-exported for the widgets

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
