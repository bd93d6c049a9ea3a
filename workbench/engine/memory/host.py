"""Host memory of this process and the machine (psutil), and its real ceiling (the memory cgroup, see cgroup.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from workbench.engine.memory.cgroup import MemoryCeiling, read_ceiling


@dataclass(frozen=True)
class HostMemory:
    """Process RSS split into anonymous and file-backed (mmap'd weights are file-backed)."""

    rss: int
    rss_anon: int
    rss_file: int
    system_total: int
    system_available: int
    swap_used: int
    ceiling: MemoryCeiling | None = None  # None: not read (a test's fixed figures): the host's RAM is the ceiling

    @property
    def limit(self) -> int:
        """What this process may use: the memory cgroup's limit where one applies, else the host's RAM."""
        return self.ceiling.limit_bytes if self.ceiling is not None else self.system_total

    @property
    def limit_source(self) -> str:
        return self.ceiling.limit_source if self.ceiling is not None else "host"

    @property
    def cgroup_usage(self) -> int | None:
        return self.ceiling.usage_bytes if self.ceiling is not None else None


_process = psutil.Process()
_SYSTEM_EVERY = 1.0  # seconds: the machine-wide figures move slowly and cost more to read than ours
_system: tuple[float, int, int, int] | None = None  # (when, total, available, swap used)


def read_host_memory() -> HostMemory:
    """This process's memory and its cgroup's usage every call (about 15 + 5 us); system RAM and swap at most
    once a second, the cgroup's limits every few seconds."""
    global _system
    info = _process.memory_info()
    shared = getattr(info, "shared", 0)  # Linux: resident file-backed + shmem pages
    now = time.monotonic()
    if _system is None or now - _system[0] >= _SYSTEM_EVERY:
        vm = psutil.virtual_memory()
        try:
            swap_used = psutil.swap_memory().used
        except (RuntimeError, OSError):
            swap_used = 0
        _system = (now, vm.total, vm.available, swap_used)
    _, total, available, swap = _system
    return HostMemory(
        rss=info.rss,
        rss_anon=max(info.rss - shared, 0),
        rss_file=shared,
        system_total=total,
        system_available=available,
        swap_used=swap,
        ceiling=read_ceiling(),
    )
