"""The only fakes in the suite: a GPU driver this machine does not have, and a frozen host reading.

`FakeDevice` implements the `DeviceProbe` seam (workbench/engine/memory/device.py), so
the real sampler, cleanup and widgets run against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from workbench.engine.memory.device import GpuMemory
from workbench.engine.memory.host import HostMemory

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
                inactive_split=1 * GiB,
                alloc_retries=0,
                ooms=0,
                allocations=1000,
                process_used=15 * GiB,
                utilization=87,
                temperature=61,
                power_watts=250.0,
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

    def peak_allocated(self, index: int) -> int | None:
        return self.gpus_now[index].peak_allocated if index < len(self.gpus_now) else None


def frozen_host() -> HostMemory:
    return HostMemory(
        rss=int(1.5 * GiB),
        rss_anon=int(1.25 * GiB),
        rss_file=int(0.25 * GiB),
        system_total=24 * GiB,
        system_available=20 * GiB,
        swap_used=0,
    )


# --------------------------------------------------------------------------- a driver-level fake
# FakeCuda and FakeNvml stand in for `torch.cuda` and the `pynvml` module, so the real
# TorchNvmlProbe (UUID mapping, error handling) runs against them.


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "Fake A100"
    total: int = 40 * GiB
    used: int = 6 * GiB  # as nvidia-smi shows it
    driver_reserved: int = 0  # NVML's v1 reading counts it as used; v2 gives it apart
    utilization: int = 87
    temperature: int = 61
    power_mw: int = 250_000
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    lost: bool = False


class FakeCuda:
    """torch.cuda for the GPUs that are visible to this process, in torch's order."""

    def __init__(
        self, gpus: list[FakeGpu], stats: dict[int, dict[str, int]] | None = None, with_uuid: bool = True, initialized: bool = True
    ) -> None:
        self.visible = gpus
        self.stats = stats or {}
        self.with_uuid = with_uuid
        self.initialized = initialized  # torch.cuda.memory_stats is {} until CUDA starts
        self.empty_cache_calls = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def is_available(self) -> bool:
        return bool(self.visible)

    def device_count(self) -> int:
        return len(self.visible)

    def get_device_name(self, index: int) -> str:
        return self.visible[index].name

    def get_device_properties(self, index: int):
        if not self.with_uuid:
            raise AttributeError("uuid")

        class Props:
            uuid = self.visible[index].uuid.removeprefix("GPU-")

        return Props()

    def memory_stats(self, index: int) -> dict[str, int]:
        return self.stats.get(index, {}) if self.initialized else {}

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1

    def reset_peak_memory_stats(self, index: int) -> None:
        pass

    def memory_stats_as_nested_dict(self, index: int) -> dict[str, Any]:
        """torch's nested form of `memory_stats`: "allocated_bytes.all.peak" is ["allocated_bytes"]["all"]["peak"]."""
        nested: dict[str, Any] = {}
        for key, value in self.memory_stats(index).items():
            *path, last = key.split(".")
            place = nested
            for part in path:
                place = place.setdefault(part, {})
            place[last] = value
        return nested


class FakeNvml:
    """The parts of pynvml that the probe uses; `unsupported` names functions this 'driver' lacks."""

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus: list[FakeGpu], unsupported: set[str] = frozenset(), init_error: str | None = None) -> None:
        self.all = gpus
        self.unsupported = set(unsupported)
        self.init_error = init_error

    def _check(self, name: str, handle: FakeGpu | None = None) -> None:
        if name in self.unsupported:
            raise NVMLError(f"{name}: Not Supported")
        if handle is not None and handle.lost:
            raise NVMLError("GPU is lost")

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.all)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.all[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        return next(g for g in self.all if g.uuid == uuid)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> bytes:
        return handle.uuid.encode()

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None):
        self._check("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", handle)

        class Info:
            used = handle.used if version else handle.used + handle.driver_reserved
            total = handle.total
            reserved = handle.driver_reserved

        return Info()

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu):
        self._check("nvmlDeviceGetUtilizationRates", handle)

        class Rates:
            gpu = handle.utilization

        return Rates()

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        return handle.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return handle.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu):
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)

        class Proc:
            def __init__(self, pid: int, used: int) -> None:
                self.pid, self.usedGpuMemory = pid, used

        return [Proc(pid, used) for pid, used in handle.processes.items()]
