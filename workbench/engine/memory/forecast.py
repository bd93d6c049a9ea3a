"""When memory will reach its ceiling, from its trend: a warning ahead of the kill, and a moment to act.

The kernel's OOM killer (or a container's) sends SIGKILL: no handler runs, nothing is
saved. The only defence is to see it coming. Fed one sample at a time (the memory
sampler's), `MemoryForecast` fits a line to the last `window` seconds and calls it a
trend only when the climb is sustained: it fills the window (to warn) or at least 3 s
(to act, when the ceiling is only seconds away) and, when steps run, at least 3 step
boundaries (memory that one long step builds up and frees at its end
is no leak, however steep), the fit is good (most of the change is the line, not
noise), the slope is real (above `MIN_RATE`) and the window really climbed (at least
`MIN_CLIMB`). A flat run, a sawtooth of allocations freed each step, or one jump (a
new buffer) is no trend. A warning clears itself once the climb stops.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW_SECONDS = 10.0
MIN_RATE = 1 << 20  # bytes per second: slower growth is no emergency
MIN_CLIMB = 64 << 20  # bytes the window must have climbed
MIN_FIT = 0.8  # R² of the line: a steady climb, not noise
MIN_SPAN = 3.0  # seconds of climb enough to act on, when the ceiling is that near
WARN_SPAN = 0.9  # share of the window a climb must fill to be warned about
MIN_STEPS = 3  # step boundaries the climb must span, when steps are running
WARN_HORIZON = 300.0  # warn when the ceiling is this many seconds away, or nearer
CLEAR_AFTER = 5.0  # seconds without a trend before a warning clears


@dataclass(frozen=True)
class Trend:
    rate: float  # bytes per second
    used: float  # the fitted value now
    seconds_left: float  # until the ceiling, at this rate


@dataclass(frozen=True)
class ForecastChange:
    """What changed with this sample: a new warning, the moment to act, or the all-clear."""

    kind: str  # "warn", "act", "clear"
    trend: Trend | None
    ceiling: int


class MemoryForecast:
    def __init__(self, *, window: float = WINDOW_SECONDS, warn_horizon: float = WARN_HORIZON) -> None:
        self.window = window
        self.warn_horizon = warn_horizon
        self._samples: deque[tuple[float, float]] = deque()
        self._steps: deque[int | None] = deque()
        self.warning: Trend | None = None  # the trend warned about, until it clears
        self._acted = False
        self._calm_since: float | None = None

    def add(
        self, t: float, used: int, ceiling: int | None, act_within: float, step: int | None = None
    ) -> ForecastChange | None:
        """One sample; `act_within`: seconds the action needs (a snapshot's time plus a margin); `step`: the
        training step count at the sample, when known."""
        self._samples.append((t, float(used)))
        self._steps.append(step)
        while self._samples and self._samples[0][0] < t - self.window:
            self._samples.popleft()
            self._steps.popleft()
        # Acting needs the ceiling imminent on a short climb (a fast leak leaves no time for more); a warning
        # needs the climb to fill the window (a ramp of a few slow steps that is then freed is no leak).
        short = self.trend(ceiling, MIN_SPAN) if ceiling else None
        if short is not None and short.seconds_left <= act_within and not self._acted:
            self._acted, self.warning, self._calm_since = True, short, None
            return ForecastChange("act", short, ceiling or 0)
        trend = self.trend(ceiling, self.window * WARN_SPAN) if ceiling else None
        if trend is None or trend.seconds_left > self.warn_horizon:
            if self.warning is None:
                return None
            self._calm_since = self._calm_since if self._calm_since is not None else t
            if t - self._calm_since < CLEAR_AFTER:
                return None
            self.warning, self._acted, self._calm_since = None, False, None
            return ForecastChange("clear", None, ceiling or 0)
        self._calm_since = None
        assert ceiling is not None
        if self.warning is None:
            self.warning = trend
            return ForecastChange("warn", trend, ceiling)
        self.warning = trend  # the status bar follows the latest figure
        return None

    def trend(self, ceiling: int, span: float = MIN_SPAN) -> Trend | None:
        """A sustained climb toward `ceiling` over at least `span` seconds of the window, or None."""
        if len(self._samples) < 5 or self._samples[-1][0] - self._samples[0][0] < span:
            return None
        first, last = self._steps[0], self._steps[-1]
        if first is not None and last is not None and last - first < MIN_STEPS:
            return None  # within one or two steps: memory a step builds up and frees is no trend
        n = len(self._samples)
        ts = [t for t, _ in self._samples]
        ys = [y for _, y in self._samples]
        if max(ys) - min(ys) < MIN_CLIMB / 4:
            # The usual case, flat memory, without the fit (the sampler's thread, 10 times a second): a line through
            # samples taken at a steady rate climbs at most sqrt(3) times their range, so none climbs MIN_CLIMB.
            return None
        mean_t, mean_y = sum(ts) / n, sum(ys) / n
        var_t = sum((t - mean_t) ** 2 for t in ts)
        if var_t <= 0:
            return None
        slope = sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys)) / var_t
        var_y = sum((y - mean_y) ** 2 for y in ys)
        fit = (slope * slope * var_t / var_y) if var_y > 0 else 0.0
        climbed = slope * (ts[-1] - ts[0])
        if slope < MIN_RATE or climbed < MIN_CLIMB or fit < MIN_FIT:
            return None
        now = mean_y + slope * (ts[-1] - mean_t)
        return Trend(rate=slope, used=now, seconds_left=max(0.0, (ceiling - now) / slope))
