"""Memory figures as a front end receives them: plain frozen records, no torch, no psutil.

They carry the attributes the memory gauges read from the engine's records
(`workbench.engine.memory.sampler.MemorySample`, `workbench.engine.memory.device.GpuMemory`,
`workbench.engine.memory.host.HostMemory`), which import torch or psutil. The field
names of `GpuMemory` are the engine's, and a test keeps them so; `HostMemory`
holds as plain fields what the engine's computes from its cgroup reading
(`limit`, `limit_source`, `cgroup_usage`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from workbench.protocol.events import Memory


@dataclass(frozen=True)
class HostMemory:
    rss: int
    rss_anon: int
    rss_file: int
    system_total: int
    system_available: int
    swap_used: int = 0
    limit: int = 0  # the real ceiling: the memory cgroup's limit where one applies, else the host's RAM
    limit_source: str = "host"
    cgroup_usage: int | None = None


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as torch's allocator and NVML see it (the engine measures it, clients read it). A field is None when it is not available."""

    index: int
    name: str
    uuid: str | None = None
    # torch's caching allocator (this process)
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    inactive_split: int | None = None  # cached but split: memory empty_cache() cannot return
    alloc_retries: int | None = None  # cudaMalloc failed, cache flushed, retried: a sign of pressure
    ooms: int | None = None
    allocations: int | None = None  # cumulative count of device allocations
    # NVML (the whole device)
    device_used: int | None = None
    device_total: int | None = None
    # What this process may use: the device's memory, a MIG slice's, or set_per_process_memory_fraction's share
    limit: int | None = None
    limit_source: str | None = None  # "device", "MIG slice", "set_per_process_memory_fraction(0.50)"
    process_used: int | None = None  # this process, from the compute process list
    utilization: int | None = None  # percent
    temperature: int | None = None  # Celsius
    power_watts: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def fragmentation(self) -> float | None:
        """Share of reserved memory that is split and inactive (cannot be returned by empty_cache)."""
        if self.inactive_split is None or not self.reserved:
            return None
        return self.inactive_split / self.reserved


@dataclass(frozen=True)
class MemorySample:
    time: float
    host: HostMemory
    gpus: tuple[GpuMemory, ...] = field(default_factory=tuple)
    gpu_note: str | None = None
    allocations_per_step: tuple[float | None, ...] = ()  # per GPU


HOST_FIELDS = tuple(f.name for f in dataclasses.fields(HostMemory))
GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuMemory))


def gpu_from_dict(data: dict[str, Any]) -> GpuMemory:
    """A GPU from its dict in a `memory` event (keys this version does not know are left out)."""
    return GpuMemory(**{name: data[name] for name in GPU_FIELDS if name in data})


def sample_from_event(event: Memory) -> MemorySample:
    """What a `memory` event says, as the gauges read it. The sample's time is the event's."""
    gpus = tuple(gpu_from_dict(g) for g in event.gpus)
    return MemorySample(
        time=event.time,
        host=HostMemory(
            rss=event.rss_bytes,
            rss_anon=event.rss_anon_bytes,
            rss_file=event.rss_file_bytes,
            system_total=event.system_total_bytes,
            system_available=event.system_available_bytes,
            swap_used=event.swap_used_bytes or 0,
            limit=event.limit_bytes if event.limit_bytes is not None else event.system_total_bytes,
            limit_source=event.limit_source or "host",
            cgroup_usage=event.cgroup_usage_bytes,
        ),
        gpus=gpus,
        gpu_note=event.gpu_note,
        allocations_per_step=tuple(g.get("allocations_per_step") for g in event.gpus),
    )
