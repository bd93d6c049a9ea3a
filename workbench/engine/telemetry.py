"""What front ends read on a timer: metric series, step rate, latest memory sample.

The training thread only appends to deques (no locks, no waiting); readers copy
them with `tuple(deque)`, which CPython performs in one step under the GIL, so
a reader never sees a half-written series and the writer never waits.
"""

from __future__ import annotations

import time
from collections import deque

from workbench.engine.memory.sampler import MemorySample
from workbench.engine.versions import VersionTable
from workbench.protocol.mirror import Series, chart_series, replay_series, steps_per_second  # one of each rule on both sides

SERIES_POINTS = 20_000


class Telemetry:
    def __init__(self, points: int = SERIES_POINTS, memory_history: int = 3000) -> None:
        self._points = points
        self._memory_history: deque[MemorySample] = deque(maxlen=memory_history)
        self.step_peaks: dict[int, int] = {}  # GPU index -> peak allocated during the last step
        self.versions = VersionTable()
        self._series: dict[str, deque[tuple[int, float]]] = {}
        self._step_times: deque[float] = deque(maxlen=512)
        self._version_starts: deque[tuple[int, int]] = deque(maxlen=1000)
        self.memory: MemorySample | None = None
        self.last_step_ms: float | None = None
        self.updates = 0  # bumped on every step or version: readers skip work when it has not moved

    # Writer side (training thread, sampler thread) ------------------------------------
    def record_step(self, step: int, scalars: dict[str, float], ms: float, *, count: bool = True) -> None:
        """Append a step's scalars; `count=False` for figures that are not a step (evaluation)."""
        for name, value in scalars.items():
            series = self._series.get(name)
            if series is None:
                series = self._series.setdefault(name, deque(maxlen=self._points))
            series.append((step, value))
        self.updates += 1
        if count:
            self._step_times.append(time.monotonic())
            self.last_step_ms = ms

    def record_version(self, step: int, version: int, changed: tuple[str, ...] = ()) -> None:
        self._version_starts.append((step, version))
        self.updates += 1
        self.versions.start(version, changed, step)  # a no-op when the version did not change

    def store_memory(self, sample: MemorySample) -> None:
        self.memory = sample
        self._memory_history.append(sample)
        reserved = [g.reserved for g in sample.gpus if g.reserved is not None]
        self.versions.record_memory(sample.host.rss, sum(reserved) if reserved else None)

    def memory_history(self, seconds: float) -> tuple[MemorySample, ...]:
        """Samples of the last `seconds` (oldest first) for the gauges' history lines."""
        samples = tuple(self._memory_history)
        if not samples:
            return ()
        cutoff = samples[-1].time - seconds
        return tuple(s for s in samples if s.time >= cutoff)

    # Reader side (UI timers) -------------------------------------------------------------
    def series(self, max_points: int | None = None) -> list[Series]:
        """Every series, downsampled to at most `max_points` points (the last point is always kept)."""
        return replay_series(self._series, max_points)

    def chart_series(self, max_points: int) -> list[Series]:
        return chart_series(self._series, max_points)

    def latest(self, name: str) -> float | None:
        series = self._series.get(name)
        try:
            return series[-1][1] if series else None
        except IndexError:
            return None

    def step_times(self) -> tuple[float, ...]:
        """When the recent steps ended (time.monotonic()), oldest first: a late client's steps/s."""
        return tuple(self._step_times)

    def version_starts(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._version_starts)

    def steps_per_second(self, window: float = 3.0) -> float:
        return steps_per_second(tuple(self._step_times), time.monotonic(), window)
