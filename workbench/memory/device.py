"""The one seam between vram-bench and the GPU driver (NVML and torch.cuda).

Every device query goes through a `DeviceProbe`. Driver errors become "not
available" values, never exceptions, so a machine without a GPU, an old driver
or a lost GPU never takes the session down. Tests drive the app with a fake
probe (see tests/fakes.py).
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as torch and NVML see it. Fields are None when not available."""

    index: int
    name: str
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    device_used: int | None = None
    device_total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeviceProbe(Protocol):
    def available(self) -> bool:
        """True when torch can use a CUDA device."""

    def unavailable_reason(self) -> str | None:
        """A plain sentence saying why GPU figures are missing (None when they are not)."""

    def gpus(self) -> list[GpuMemory]:
        """Current memory of every visible GPU."""

    def empty_cache(self) -> None:
        """Return torch's cached-but-free blocks to the driver."""

    def reset_peaks(self) -> None:
        """Start peak tracking afresh."""


class TorchNvmlProbe:
    """The real probe: torch.cuda for the allocator, NVML (nvidia-ml-py) for the device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._nvml_handles: dict[int, Any] = {}
        self._nvml_note: str | None = None
        self._nvml_started = False

    def available(self) -> bool:
        try:
            return bool(torch.cuda.is_available())
        except Exception:  # noqa: BLE001
            return False

    def unavailable_reason(self) -> str | None:
        if not self.available():
            if torch.version.cuda is None:
                return "No GPU: this torch build is CPU-only, so only host memory is shown."
            return "No GPU: torch.cuda.is_available() is False (no NVIDIA driver or no visible device), so only host memory is shown."
        self._start_nvml()
        return self._nvml_note

    def gpus(self) -> list[GpuMemory]:
        if not self.available():
            return []
        self._start_nvml()
        out = []
        for index in range(_safe(torch.cuda.device_count, 0)):
            used, total = self._nvml_memory(index)
            out.append(
                GpuMemory(
                    index=index,
                    name=_safe(lambda: torch.cuda.get_device_name(index), f"cuda:{index}"),
                    allocated=_safe(lambda: torch.cuda.memory_allocated(index)),
                    reserved=_safe(lambda: torch.cuda.memory_reserved(index)),
                    peak_allocated=_safe(lambda: torch.cuda.max_memory_allocated(index)),
                    peak_reserved=_safe(lambda: torch.cuda.max_memory_reserved(index)),
                    device_used=used,
                    device_total=total,
                )
            )
        return out

    def empty_cache(self) -> None:
        if self.available():
            _safe(torch.cuda.empty_cache)

    def reset_peaks(self) -> None:
        if self.available():
            for index in range(_safe(torch.cuda.device_count, 0)):
                _safe(lambda: torch.cuda.reset_peak_memory_stats(index))

    # NVML ----------------------------------------------------------------------------
    def _start_nvml(self) -> None:
        with self._lock:
            if self._nvml_started:
                return
            self._nvml_started = True
            try:
                import pynvml  # provided by nvidia-ml-py; imported lazily, it may be absent or shadowed

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as exc:  # noqa: BLE001
                self._nvml_note = f"NVML is not available ({exc}); device-wide memory is not shown, torch's allocator figures are."

    def _nvml_memory(self, torch_index: int) -> tuple[int | None, int | None]:
        nvml = self._nvml
        if nvml is None:
            return None, None
        handle = self._nvml_handles.get(torch_index)
        if handle is None:
            handle = self._handle_for(torch_index)
            if handle is None:
                return None, None
            self._nvml_handles[torch_index] = handle
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.used), int(info.total)
        except Exception:  # noqa: BLE001 - a lost GPU or an old driver: not available
            return None, None

    def _handle_for(self, torch_index: int) -> Any:
        """Match torch's device to NVML's by UUID, so CUDA_VISIBLE_DEVICES reordering is respected."""
        nvml = self._nvml
        try:
            uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        except Exception:  # noqa: BLE001
            uuid = None
        try:
            count = nvml.nvmlDeviceGetCount()
            for i in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                nvml_uuid = nvml.nvmlDeviceGetUUID(handle)
                nvml_uuid = nvml_uuid.decode() if isinstance(nvml_uuid, bytes) else str(nvml_uuid)
                if uuid and nvml_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                    return handle
            if uuid is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
                return nvml.nvmlDeviceGetHandleByIndex(torch_index)
        except Exception:  # noqa: BLE001
            return None
        return None


def _safe(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the seam's whole point: driver errors become "not available"
        return default
