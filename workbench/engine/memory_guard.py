"""Memory limits seen before they kill: warn, then snapshot and pause in time (`--on-memory-limit`).

Runs on the memory sampler's thread, one sample at a time: the host's trend (this
process's RSS against its ceiling: the memory cgroup's limit, or RSS plus what the
machine still has available) and each GPU's (allocated against what the process may
use) feed a `MemoryForecast` each. A warning goes out as an event once per episode
(and clears itself); the moment to act, with room for one snapshot, is handed to the
training thread as a command: it never blocks here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.protocol.events import Command, Error, Event
from workbench.engine.memory.forecast import ForecastChange, MemoryForecast, Trend
from workbench.engine.memory.sampler import MemorySample
from workbench.units import human_bytes

ACTIONS = ("snapshot", "pause", "warn")


@dataclass(frozen=True)
class MemoryLimitNear(Command):
    """Internal, for the training thread: the ceiling is near; do what `--on-memory-limit` says."""

    what: str  # "host" or "cuda:0"
    sentence: str


class MemoryGuard:
    def __init__(
        self,
        publish: Callable[[Event], None],
        act: Callable[[MemoryLimitNear], None],
        seconds_to_act: Callable[[], float],
        action: str = "snapshot",
        step_count: Callable[[], int | None] = lambda: None,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"--on-memory-limit must be one of {', '.join(ACTIONS)}")
        self._publish = publish
        self._act = act
        self._seconds_to_act = seconds_to_act
        self._step_count = step_count
        self.action = action
        self._forecasts: dict[str, MemoryForecast] = {}
        self.warning: str | None = None  # for the status bar, while a trend lasts

    def observe(self, sample: MemorySample) -> None:
        host = sample.host
        if host.limit_source != "host":
            ceiling, label = host.limit, f"the {human_bytes(host.limit)} limit ({host.limit_source})"
        else:
            ceiling, label = host.rss + host.system_available, f"the machine's memory ({human_bytes(host.system_available)} free)"
        self._feed("host", sample.time, host.rss, ceiling, label)
        for gpu in sample.gpus:
            ceiling = gpu.limit or gpu.device_total  # what this process may use (a MIG slice, a memory fraction)
            if ceiling and gpu.allocated is not None:
                label = f"the {human_bytes(ceiling)} it may use ({gpu.limit_source or 'device'})"
                self._feed(f"cuda:{gpu.index}", sample.time, gpu.allocated, ceiling, label)

    def _feed(self, what: str, t: float, used: int, ceiling: int, label: str) -> None:
        forecast = self._forecasts.setdefault(what, MemoryForecast())
        act_within = self._seconds_to_act() if self.action != "warn" else 0.0
        change = forecast.add(t, used, ceiling, act_within, self._step_count())
        if change is None:
            if forecast.warning is not None:
                self.warning = _sentence(what, forecast.warning, label)
            return
        self._report(what, change, label)

    def _report(self, what: str, change: ForecastChange, label: str) -> None:
        if change.kind == "clear":
            self.warning = None if all(f.warning is None for f in self._forecasts.values()) else self.warning
            self._publish(Error(where="memory limit", message=f"{what} memory stopped growing: the warning is cleared"))
            return
        assert change.trend is not None
        self.warning = _sentence(what, change.trend, label)
        if change.kind == "warn":
            self._publish(Error(where="memory limit", message=self.warning))
        else:
            self._act(MemoryLimitNear(what, self.warning))


def _sentence(what: str, trend: Trend, label: str) -> str:
    return f"{what} memory grows {human_bytes(trend.rate)}/s: {label} in ~{trend.seconds_left:.0f} s"
