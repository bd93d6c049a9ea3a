"""Time the process spent stopped (SIGSTOP, a suspended batch job, ctrl+z), so no step is blamed for it.

A stopped process runs no thread, so a thread that wakes on a short period notices it
afterwards: its wake-up came far later than asked. The gap, less the period, is time
the process was stopped (or the machine was too busy to run it at all, which is no
step's fault either).
"""

from __future__ import annotations

import time
from collections import deque

# A wake-up this much later than asked counts as a stop (scheduling jitter on a busy machine stays below it).
LATE_SECONDS = 1.0


class SuspendedTime:
    """Fed by one periodic thread (`tick`), which also reads it (`since`)."""

    def __init__(self, keep: int = 64) -> None:
        self._last: float | None = None
        self._stops: deque[tuple[float, float]] = deque(maxlen=keep)  # (start, end) in time.monotonic()

    def tick(self, period: float) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last - period > LATE_SECONDS:
            self._stops.append((self._last + period, now))
        self._last = now

    def since(self, moment: float) -> float:
        """Seconds the process was stopped after `moment` (a step's start)."""
        return sum(end - max(start, moment) for start, end in self._stops if end > moment)
