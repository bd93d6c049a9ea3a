"""Human-readable sizes, shared by the engine's messages and the front ends."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def compact_bytes(n: float | None) -> str:
    """At most 5 characters (`384M`, `1.2G`, `12G`): for columns, where a row must fit a narrow pane."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":  # 1000, not 1024: `1023M` would be five digits wide
            return f"{n:.1f}{unit}" if abs(n) < 10 and unit != "B" else f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}T"


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
