"""A thread that samples memory (10 Hz by default), so nothing on the training path does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.protocol.events import Memory
from workbench.engine.memory.device import DeviceProbe, GpuMemory
from workbench.engine.memory.host import HostMemory, read_host_memory


@dataclass(frozen=True)
class MemorySample:
    time: float
    host: HostMemory
    gpus: tuple[GpuMemory, ...] = field(default_factory=tuple)
    gpu_note: str | None = None
    allocations_per_step: tuple[float | None, ...] = ()  # per GPU, over the last sampling window with steps

    def to_event(self) -> Memory:
        return Memory(
            time=self.time,  # when it was measured: the gauges' history lines of an attached app line up
            swap_used_bytes=getattr(self.host, "swap_used", None),
            rss_bytes=self.host.rss,
            rss_anon_bytes=self.host.rss_anon,
            rss_file_bytes=self.host.rss_file,
            system_total_bytes=self.host.system_total,
            system_available_bytes=self.host.system_available,
            limit_bytes=self.host.limit,
            limit_source=self.host.limit_source,
            cgroup_usage_bytes=self.host.cgroup_usage,
            gpus=tuple(
                {**g.to_dict(), "allocations_per_step": rate}
                for g, rate in zip(self.gpus, self.allocations_per_step or (None,) * len(self.gpus))
            ),
            gpu_note=self.gpu_note,
        )


HostReader = Callable[[], HostMemory]


def take_sample(probe: DeviceProbe, read_host: HostReader = read_host_memory) -> MemorySample:
    return MemorySample(time=time.time(), host=read_host(), gpus=tuple(probe.gpus()), gpu_note=probe.unavailable_reason())


class MemorySampler(threading.Thread):
    """Samples every `interval` s (`idle_interval` while `idle()`) into `store`; publishes a `memory`
    event every `event_interval` s."""

    def __init__(
        self,
        probe: DeviceProbe,
        store: Callable[[MemorySample], None],
        publish: Callable[[Memory], None],
        *,
        interval: float = 0.25,
        event_interval: float = 2.0,
        read_host: HostReader = read_host_memory,
        step_count: Callable[[], int] = lambda: 0,
        idle: Callable[[], bool] = lambda: False,
        idle_interval: float | None = None,
    ) -> None:
        super().__init__(name="vram-bench-memory", daemon=True)
        self._idle = idle
        self._idle_interval = idle_interval
        self._probe = probe
        self._store = store
        self._publish = publish
        self._interval = interval
        self._event_interval = event_interval
        self._read_host = read_host
        self._step_count = step_count
        self._last_counts: tuple[int, tuple[int | None, ...]] | None = None
        self._rates: tuple[float | None, ...] = ()
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_event = 0.0
        while not self._stop_event.is_set():
            sample = self._with_rates(take_sample(self._probe, self._read_host))
            self._store(sample)
            now = time.monotonic()
            if self._event_interval > 0 and now - last_event >= self._event_interval:
                self._publish(sample.to_event())
                last_event = now
            self._stop_event.wait(self._next_interval())

    def _next_interval(self) -> float:
        """While nothing trains (paused), memory barely moves: sample slower and leave the CPU alone."""
        if self._idle_interval is not None and self._idle():
            return max(self._interval, self._idle_interval)
        return self._interval

    def _with_rates(self, sample: MemorySample) -> MemorySample:
        """Device allocations per training step, from the allocator's cumulative count."""
        step, counts = self._step_count(), tuple(g.allocations for g in sample.gpus)
        if self._last_counts is not None and step > self._last_counts[0] and len(counts) == len(self._last_counts[1]):
            steps = step - self._last_counts[0]
            self._rates = tuple(
                (now - before) / steps if now is not None and before is not None else None
                for now, before in zip(counts, self._last_counts[1])
            )
        if self._last_counts is None or step != self._last_counts[0]:
            self._last_counts = (step, counts)
        return MemorySample(sample.time, sample.host, sample.gpus, sample.gpu_note, self._rates)

    def stop(self) -> None:
        self._stop_event.set()
