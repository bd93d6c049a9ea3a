"""A pretend asynchronous device for the step values' seam (workbench/engine/step_values.py).

This machine has no GPU, so the tests stand in for CUDA's copy-and-event with a device whose copies finish
only when the test says so (or when the worker waits for them), and which records every copy, wait and read
in order: the tests read from that journal when the worker looked at each step's loss.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False)
class DeviceScalar:
    """A one-element value living on the pretend device, as `loss.detach()` on a GPU would be."""

    value: float
    device: PretendDevice


@dataclass
class PretendDevice:
    """Copies finish when `finish_copies` is set (or at once for a `ready` device), or when the worker waits."""

    ready: bool = False  # every copy is done by the time anyone asks
    fail_next_wait: bool = False  # the next wait raises, as a CUDA error of a step's kernels does at the next sync
    journal: list[tuple[str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def scalar(self, value: float) -> DeviceScalar:
        return DeviceScalar(float(value), self)

    def note(self, what: str, value: float) -> None:
        with self.lock:
            self.journal.append((what, value))

    def entries(self, what: str) -> list[float]:
        with self.lock:
            return [value for kind, value in self.journal if kind == what]


class PretendReader:
    """`DeferredReader` for `DeviceScalar`s."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DeviceScalar)

    def keep(self, value: DeviceScalar) -> DeviceScalar:
        return DeviceScalar(value.value, value.device)  # frozen: a copy of what it holds now

    def copy(self, value: DeviceScalar) -> DeviceScalar:
        value.device.note("copy", value.value)
        return value

    def mark(self, values: list[DeviceScalar]) -> PretendDevice:
        return values[0].device

    def ready(self, mark: PretendDevice) -> bool:
        return mark.ready

    def wait(self, mark: PretendDevice) -> None:
        mark.note("wait", 0.0)
        if mark.fail_next_wait:
            mark.fail_next_wait = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered (pretend)")

    def read(self, copied: DeviceScalar) -> float:
        copied.device.note("read", copied.value)
        return copied.value


READER = PretendReader()
DEVICE = PretendDevice()  # the project under test reaches it by import; each test resets it
