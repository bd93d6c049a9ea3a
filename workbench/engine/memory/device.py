"""The one seam between vram-bench and the GPU driver (NVML and torch.cuda).

Every device query goes through a `DeviceProbe`. Driver errors become "not
available" values (None), never exceptions, so a machine without a GPU, an old
driver missing an NVML function, or a lost GPU never takes the session down;
`unavailable_reason()` says once, plainly, what cannot be shown.

`TorchNvmlProbe` takes its `torch.cuda` and its NVML module as arguments, so
tests drive the real mapping and error handling with fakes (tests/fakes.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from workbench.protocol.payloads import GpuMemory  # what the engine measures is what crosses the wire


class DeviceProbe(Protocol):
    def available(self) -> bool:
        """True when torch can use a CUDA device."""

    def unavailable_reason(self) -> str | None:
        """A plain sentence saying what GPU figures are missing and why (None when nothing is)."""

    def gpus(self) -> list[GpuMemory]:
        """Current figures for every visible GPU."""

    def empty_cache(self) -> None:
        """Return torch's cached-but-free blocks to the driver."""

    def reset_peaks(self) -> None:
        """Start peak tracking afresh."""

    def peak_allocated(self, index: int) -> int | None:
        """Peak bytes allocated by torch on a GPU since the last reset (cheap: called every step)."""


def _import_pynvml() -> Any:
    import pynvml  # provided by nvidia-ml-py; imported lazily: it may be absent or shadowed

    return pynvml


class TorchNvmlProbe:
    """The real probe: torch.cuda for the allocator, NVML for the device."""

    def __init__(self, cuda: Any = None, load_nvml: Callable[[], Any] = _import_pynvml, pid: int | None = None) -> None:
        self._cuda = cuda if cuda is not None else torch.cuda
        self._load_nvml = load_nvml
        self._pid = pid if pid is not None else os.getpid()
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._nvml_note: str | None = None
        self._nvml_started = False
        self._handles: dict[int, Any] = {}
        self._missing: set[str] = set()  # NVML readings this driver cannot give
        self._memory_v1_only = False  # a driver without nvmlDeviceGetMemoryInfo_v2

    # DeviceProbe -----------------------------------------------------------------------
    def available(self) -> bool:
        return bool(_safe(self._cuda.is_available, False))

    def unavailable_reason(self) -> str | None:
        if not self.available():
            if getattr(torch.version, "cuda", None) is None and self._cuda is torch.cuda:
                return "No GPU: this torch build is CPU-only, so only host memory is shown."
            return "No GPU: torch.cuda.is_available() is False (no NVIDIA driver or no visible device), so only host memory is shown."
        self._start_nvml()
        notes = [self._nvml_note] if self._nvml_note else []
        if self._missing:
            notes.append(f"Not available from this driver: {', '.join(sorted(self._missing))}.")
        return " ".join(notes) or None

    def gpus(self) -> list[GpuMemory]:
        if not self.available():
            return []
        self._start_nvml()
        return [self._gpu(index) for index in range(_safe(self._cuda.device_count, 0))]

    def empty_cache(self) -> None:
        if self.available():
            _safe(self._cuda.empty_cache)

    def reset_peaks(self) -> None:
        if self.available():
            for index in range(_safe(self._cuda.device_count, 0)):
                _safe(lambda: self._cuda.reset_peak_memory_stats(index))

    def peak_allocated(self, index: int) -> int | None:
        # Not max_memory_allocated(): that flattens every allocator statistic into a new dict, 78 us a call against
        # 10 us for the nested one on an H200's host, and this runs every step (bench/RESULTS.md, "loss_sync").
        return _safe(lambda: self._cuda.memory_stats_as_nested_dict(index)["allocated_bytes"]["all"]["peak"])

    # torch.cuda ------------------------------------------------------------------------
    def _gpu(self, index: int) -> GpuMemory:
        stats = _safe(lambda: self._cuda.memory_stats(index), {}) or {}
        if not stats and not _safe(self._cuda.is_initialized, True):
            stats = _UNINITIALIZED  # torch gives no stats before CUDA starts; nothing is allocated then
        props = _safe(lambda: self._cuda.get_device_properties(index))
        uuid = _props_uuid(props)
        handle = self._handle_for(index, uuid)
        used, total = self._nvml_memory(handle)
        name = _safe(lambda: self._cuda.get_device_name(index), f"cuda:{index}")
        limit, limit_source = self._limit(index, name, props, total)
        return GpuMemory(
            index=index,
            name=name,
            uuid=uuid,
            allocated=stats.get("allocated_bytes.all.current"),
            reserved=stats.get("reserved_bytes.all.current"),
            peak_allocated=stats.get("allocated_bytes.all.peak"),
            peak_reserved=stats.get("reserved_bytes.all.peak"),
            inactive_split=stats.get("inactive_split_bytes.all.current"),
            alloc_retries=stats.get("num_alloc_retries"),
            ooms=stats.get("num_ooms"),
            allocations=stats.get("allocation.all.allocated"),
            device_used=used,
            device_total=total,
            limit=limit,
            limit_source=limit_source,
            process_used=self._nvml_reading("process memory", handle, self._process_memory),
            utilization=self._nvml_reading("utilization", handle, lambda h: int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
            temperature=self._nvml_reading(
                "temperature", handle, lambda h: int(self._nvml.nvmlDeviceGetTemperature(h, self._nvml.NVML_TEMPERATURE_GPU))
            ),
            power_watts=self._nvml_reading("power", handle, lambda h: self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
        )

    def _limit(self, index: int, name: str, props: Any, nvml_total: int | None) -> tuple[int | None, str | None]:
        """The most this process can reach on the device: never more than it may use.

        torch sees a MIG slice's memory as the device's (`total_memory`), NVML the whole GPU's;
        `set_per_process_memory_fraction` caps torch's reserved memory at that share of `total_memory`.
        The fraction is read only once CUDA is initialized (reading it would initialize CUDA; before
        that, no fraction can have been set).
        """
        visible = _safe(lambda: int(props.total_memory)) if props is not None else None
        total = visible or nvml_total
        if not total:
            return None, None
        fraction = 1.0
        if _safe(lambda: self._cuda.is_initialized(), False):
            read = getattr(self._cuda, "get_per_process_memory_fraction", None)
            fraction = _safe(lambda: float(read(index)), 1.0) if read is not None else 1.0
        if 0.0 <= fraction < 1.0:
            return int(total * fraction), f"set_per_process_memory_fraction({fraction:.2f})"
        if "MIG" in name.split() or (visible and nvml_total and visible < nvml_total * 0.95):
            return total, "MIG slice"
        return total, "device"

    # NVML --------------------------------------------------------------------------------
    def _start_nvml(self) -> None:
        with self._lock:
            if self._nvml_started:
                return
            self._nvml_started = True
            try:
                nvml = self._load_nvml()
                nvml.nvmlInit()
                self._nvml = nvml
            except Exception as exc:  # noqa: BLE001
                self._nvml_note = (
                    f"NVML is not available ({exc}): device-wide memory, utilization, temperature and power are not "
                    "shown; torch's allocator figures are."
                )

    def _handle_for(self, torch_index: int, uuid: str | None) -> Any:
        """NVML's handle for torch's device: matched by UUID, so CUDA_VISIBLE_DEVICES reordering is respected."""
        if self._nvml is None:
            return None
        if torch_index in self._handles:
            return self._handles[torch_index]
        handle = None
        try:
            if uuid is not None:
                for i in range(self._nvml.nvmlDeviceGetCount()):
                    candidate = self._nvml.nvmlDeviceGetHandleByIndex(i)
                    if _normal_uuid(_text(self._nvml.nvmlDeviceGetUUID(candidate))) == uuid:
                        handle = candidate
                        break
            else:
                handle = self._handle_from_visible_devices(torch_index)
        except Exception:  # noqa: BLE001 - a lost GPU or an old driver: not available
            handle = None
        if handle is not None:
            self._handles[torch_index] = handle
        return handle

    def _handle_from_visible_devices(self, torch_index: int) -> Any:
        """Without a UUID from torch: follow CUDA_VISIBLE_DEVICES (indices or UUIDs), else the same index."""
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if not visible:
            return self._nvml.nvmlDeviceGetHandleByIndex(torch_index)
        if torch_index >= len(visible):
            return None
        entry = visible[torch_index]
        if entry.isdigit():
            return self._nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return self._nvml.nvmlDeviceGetHandleByUUID(entry)

    def _nvml_memory(self, handle: Any) -> tuple[int | None, int | None]:
        """Used and total as nvidia-smi shows them.

        NVML's v1 reading counts the driver's own reservation (about 480 MiB on an H100 with driver 580)
        as used, which nvidia-smi does not; the v2 reading gives it apart. Drivers before 510 have no
        v2: v1 is the best they give.
        """
        if handle is None:
            return None, None
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if version is not None and not self._memory_v1_only:
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(info.used), int(info.total)
            except Exception:  # noqa: BLE001 - an older driver: v1 from now on
                self._memory_v1_only = True
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.used), int(info.total)
        except Exception:  # noqa: BLE001
            self._missing.add("device memory")
            return None, None

    def _process_memory(self, handle: Any) -> int | None:
        for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == self._pid:
                used = getattr(process, "usedGpuMemory", None)
                return int(used) if used is not None else None
        return None

    def _nvml_reading(self, what: str, handle: Any, read: Callable[[Any], Any]) -> Any:
        if handle is None or what in self._missing:
            return None
        try:
            return read(handle)
        except Exception:  # noqa: BLE001 - not supported by this driver/GPU: say so once, stop asking
            self._missing.add(what)
            return None


def _props_uuid(props: Any) -> str | None:
    uuid = _safe(lambda: props.uuid) if props is not None else None
    return _normal_uuid(str(uuid)) if uuid is not None else None


def _normal_uuid(text: str) -> str:
    return text.strip().lower().removeprefix("gpu-")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_UNINITIALIZED = {
    "allocated_bytes.all.current": 0,
    "reserved_bytes.all.current": 0,
    "allocated_bytes.all.peak": 0,
    "reserved_bytes.all.peak": 0,
    "inactive_split_bytes.all.current": 0,
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "allocation.all.allocated": 0,
}


def _safe(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the seam's whole point: driver errors become "not available"
        return default
