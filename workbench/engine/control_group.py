"""vram-bench's gloo control group, on the training group's gloo device when it has one.

Each gloo process group made by `dist.new_group` gets a device of its own, and a gloo device is an I/O loop
thread that wakes every 10 ms even when nothing is sent (gloo's `tcp::Loop` polls with a timeout). On a CPU run
the training group is gloo too, so a second device only adds that thread: measured on 2 cores, one idle extra
gloo group cost a plain 2-rank DDP loop about 3-5 % of its steps/s (bench/RESULTS.md). gloo shares a device
between groups by design (`ProcessGroupGloo::split` does it), but `dist.new_group` does not pass gloo options
on (its gloo branch drops `pg_options`). So the control group is made by `dist.new_group` itself, with gloo's
constructor given the default group's devices for the one call; everything else (the group's registration, its
ranks, its store prefix, its destruction) is torch's own.

Where the default group has no gloo backend (NCCL on GPUs) or torch's internals are not as expected, the
control group is made the ordinary way, with a device of its own.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

_CONSTRUCTOR_LOCK = threading.Lock()  # the constructor is swapped for one call: one swap at a time


def new_control_group(timeout: timedelta) -> dist.ProcessGroup:
    """A gloo group of every rank for vram-bench's own messages (every rank at once, like `dist.new_group`)."""
    devices = default_gloo_devices()
    if devices is None:
        return dist.new_group(backend="gloo", timeout=timeout)
    gloo = c10d.ProcessGroupGloo

    class GlooOnSharedDevices(gloo):  # type: ignore[misc, valid-type]
        """torch's gloo backend, told to use the training group's devices rather than make one."""

        def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
            options = gloo._Options()
            options._devices = devices
            options._timeout = timeout
            super().__init__(store, rank, size, options)

    with _CONSTRUCTOR_LOCK:
        c10d.ProcessGroupGloo = GlooOnSharedDevices
        try:
            return dist.new_group(backend="gloo", timeout=timeout)
        finally:
            c10d.ProcessGroupGloo = gloo


def default_gloo_devices() -> list | None:
    """The default group's gloo devices, or None when it has no gloo backend or they cannot be read."""
    try:
        if not isinstance(getattr(c10d, "ProcessGroupGloo", None), type):
            return None
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
        if not isinstance(backend, c10d.ProcessGroupGloo):
            return None
        devices = list(backend.options._devices)
        probe = c10d.ProcessGroupGloo._Options()  # the options the constructor will be given: settable here too
        probe._devices, probe._timeout = devices, timedelta(seconds=1)
        return devices or None
    except Exception:  # noqa: BLE001 - no CPU backend (NCCL only), or another torch: a device of its own then
        return None
