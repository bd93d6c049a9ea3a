"""A thread that samples memory a few times a second, so nothing on the training path does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.events import Memory
from workbench.memory.device import DeviceProbe, GpuMemory
from workbench.memory.host import HostMemory, read_host_memory


@dataclass(frozen=True)
class MemorySample:
    time: float
    host: HostMemory
    gpus: tuple[GpuMemory, ...] = field(default_factory=tuple)
    gpu_note: str | None = None

    def to_event(self) -> Memory:
        return Memory(
            rss_bytes=self.host.rss,
            rss_anon_bytes=self.host.rss_anon,
            rss_file_bytes=self.host.rss_file,
            system_total_bytes=self.host.system_total,
            system_available_bytes=self.host.system_available,
            gpus=tuple(g.to_dict() for g in self.gpus),
            gpu_note=self.gpu_note,
        )


HostReader = Callable[[], HostMemory]


def take_sample(probe: DeviceProbe, read_host: HostReader = read_host_memory) -> MemorySample:
    return MemorySample(time=time.time(), host=read_host(), gpus=tuple(probe.gpus()), gpu_note=probe.unavailable_reason())


class MemorySampler(threading.Thread):
    """Samples every `interval` s into `store`; publishes a `memory` event every `event_interval` s."""

    def __init__(
        self,
        probe: DeviceProbe,
        store: Callable[[MemorySample], None],
        publish: Callable[[Memory], None],
        *,
        interval: float = 0.25,
        event_interval: float = 2.0,
        read_host: HostReader = read_host_memory,
    ) -> None:
        super().__init__(name="vram-bench-memory", daemon=True)
        self._probe = probe
        self._store = store
        self._publish = publish
        self._interval = interval
        self._event_interval = event_interval
        self._read_host = read_host
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_event = 0.0
        while not self._stop_event.is_set():
            sample = take_sample(self._probe, self._read_host)
            self._store(sample)
            now = time.monotonic()
            if self._event_interval > 0 and now - last_event >= self._event_interval:
                self._publish(sample.to_event())
                last_event = now
            self._stop_event.wait(self._interval)

    def stop(self) -> None:
        self._stop_event.set()
