"""Host memory of this process and the machine, via psutil."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class HostMemory:
    """Process RSS split into anonymous and file-backed (mmap'd weights are file-backed)."""

    rss: int
    rss_anon: int
    rss_file: int
    system_total: int
    system_available: int
    swap_used: int


_process = psutil.Process()


def read_host_memory() -> HostMemory:
    info = _process.memory_info()
    shared = getattr(info, "shared", 0)  # Linux: resident file-backed + shmem pages
    vm = psutil.virtual_memory()
    try:
        swap_used = psutil.swap_memory().used
    except (RuntimeError, OSError):
        swap_used = 0
    return HostMemory(
        rss=info.rss,
        rss_anon=max(info.rss - shared, 0),
        rss_file=shared,
        system_total=vm.total,
        system_available=vm.available,
        swap_used=swap_used,
    )
