"""The only fakes in the suite: a GPU driver this machine does not have, and a frozen host reading.

`FakeDevice` implements the `DeviceProbe` seam (workbench/memory/device.py), so
the real sampler, cleanup and widgets run against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workbench.memory.device import GpuMemory
from workbench.memory.host import HostMemory

GiB = 1024**3


@dataclass
class FakeDevice:
    """One or more pretend GPUs with settable figures; empty_cache returns cached memory."""

    gpus_now: list[GpuMemory] = field(
        default_factory=lambda: [
            GpuMemory(
                index=0,
                name="Fake H100",
                allocated=10 * GiB,
                reserved=14 * GiB,
                peak_allocated=12 * GiB,
                peak_reserved=15 * GiB,
                device_used=16 * GiB,
                device_total=80 * GiB,
            )
        ]
    )
    note: str | None = None
    empty_cache_calls: int = 0

    def available(self) -> bool:
        return bool(self.gpus_now)

    def unavailable_reason(self) -> str | None:
        return self.note if self.gpus_now else (self.note or "No GPU: fake device has none.")

    def gpus(self) -> list[GpuMemory]:
        return list(self.gpus_now)

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1
        self.gpus_now = [
            replace(g, reserved=g.allocated, device_used=(g.device_used or 0) - ((g.reserved or 0) - (g.allocated or 0)))
            for g in self.gpus_now
        ]

    def reset_peaks(self) -> None:
        self.gpus_now = [replace(g, peak_allocated=g.allocated, peak_reserved=g.reserved) for g in self.gpus_now]


def frozen_host() -> HostMemory:
    return HostMemory(
        rss=int(1.5 * GiB),
        rss_anon=int(1.25 * GiB),
        rss_file=int(0.25 * GiB),
        system_total=24 * GiB,
        system_available=20 * GiB,
        swap_used=0,
    )
