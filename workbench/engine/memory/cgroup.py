"""The real ceiling of host memory: the process's memory cgroup limit (v2 or v1), else the host's RAM.

Containers, Slurm jobs and systemd units cap a process far below what the
machine has, and the kernel's OOM killer ends it at the cgroup's limit with no
Python exception. `CgroupReader` finds the process's memory cgroup once
(/proc/self/cgroup, mapped onto its mount through /proc/self/mountinfo's root
field, as containers need), walks from it up to the mount's root (nested limits:
the smallest applies), and afterwards reads one small file per sample: the usage
of the cgroup whose limit applies, kept open and read with pread (about 2 us).
Limits and the OOM-kill count are re-read every few seconds, since they can
change under a running process. Nothing here raises: a file that cannot be read
is "not available" (None).
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.units import human_bytes

UNLIMITED = 2**60  # v1 writes "no limit" as 9223372036854771712 (page-rounded LONG_MAX); v2 writes "max"
REFRESH_EVERY = 5.0  # seconds between re-reads of the limits and the OOM-kill count

# Per version: the limit file, the usage file, the file with the `oom_kill N` line.
_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control"),
    2: ("memory.max", "memory.current", "memory.events"),
}


@dataclass(frozen=True)
class MemoryCeiling:
    """What this process may use of host memory, and where that number comes from."""

    limit_bytes: int
    limit_source: str  # "cgroup v2 /user.slice/job-1", "cgroup v1 /docker/abc", or "host"
    usage_bytes: int | None = None  # what the limiting cgroup holds (own cgroup when none limits): every process in it, page cache included
    oom_kills: int | None = None  # OOM kills counted in the process's own memory cgroup (and below it)
    cgroup: str | None = None  # the process's own memory cgroup, "cgroup v1 /a/b"; None when none was found

    @property
    def from_cgroup(self) -> bool:
        return self.limit_source != "host"


@dataclass(frozen=True)
class CgroupLocation:
    """The process's memory cgroup: its version, and the folders from it up to its mount's root."""

    version: int  # 1 or 2
    chain: tuple[tuple[str, Path], ...]  # (cgroup path, folder), the process's own cgroup first

    @property
    def path(self) -> str:
        return self.chain[0][0]

    def label(self, path: str) -> str:
        return f"cgroup v{self.version} {path}"


# --------------------------------------------------------------------------- finding the cgroup


def find_memory_cgroup(
    proc_cgroup: str | Path = "/proc/self/cgroup", mountinfo: str | Path = "/proc/self/mountinfo"
) -> CgroupLocation | None:
    """The memory cgroup this process is in, as folders on this machine; None where there is none to read.

    A v1 `memory` hierarchy wins when there is one (hybrid systems keep the memory controller there);
    otherwise the v2 unified hierarchy, if memory files are in it.
    """
    try:
        cgroup_lines = Path(proc_cgroup).read_text().splitlines()
        mounts = _cgroup_mounts(Path(mountinfo).read_text())
    except OSError:
        return None
    v1_path = v2_path = None
    for line in cgroup_lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            v1_path = path
        elif hierarchy == "0" and controllers == "":
            v2_path = path
    for version, path in ((1, v1_path), (2, v2_path)):
        if path is None:
            continue
        for root, mount_point in mounts[version]:
            chain = _chain(root, mount_point, path)
            if chain and _has_memory_files(version, chain):
                return CgroupLocation(version, chain)
    return None


def _cgroup_mounts(mountinfo: str) -> dict[int, list[tuple[str, Path]]]:
    """(root, mount point) of every v1 memory mount and every cgroup2 mount."""
    mounts: dict[int, list[tuple[str, Path]]] = {1: [], 2: []}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 2:
            continue
        fstype, options = fields[sep + 1], fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if fstype == "cgroup" and "memory" in options:
            mounts[1].append((root, mount_point))
        elif fstype == "cgroup2":
            mounts[2].append((root, mount_point))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _chain(root: str, mount_point: Path, path: str) -> tuple[tuple[str, Path], ...]:
    """(cgroup path, folder) from the process's cgroup up to the mount point.

    The mount shows the hierarchy from `root` down (a container's mount shows only its own subtree), so
    the cgroup path loses that prefix on the way to a folder. A path outside the mount's root (another
    cgroup namespace's view) is tried as is under the mount point, else the mount point stands for it.
    """
    root = root.rstrip("/") or "/"
    path = path.removesuffix(" (deleted)")
    if root == "/" or path == root or path.startswith(root + "/"):
        relative = path[len(root) :] if root != "/" else path
        folder, cg_path = mount_point / relative.lstrip("/"), path
    elif (mount_point / path.lstrip("/")).is_dir():
        folder, cg_path = mount_point / path.lstrip("/"), path
    else:
        folder, cg_path = mount_point, root
    if not folder.is_dir():
        return ()
    chain = [(cg_path, folder)]
    while folder != mount_point and mount_point in folder.parents:
        folder, cg_path = folder.parent, posixpath.dirname(cg_path) or "/"
        chain.append((cg_path, folder))
    return tuple(chain)


def _has_memory_files(version: int, chain: tuple[tuple[str, Path], ...]) -> bool:
    limit_file, usage_file, _ = _FILES[version]
    return any((folder / limit_file).exists() or (folder / usage_file).exists() for _, folder in chain)


# --------------------------------------------------------------------------- reading it


def host_total_bytes() -> int | None:
    """The machine's RAM (MemTotal), from sysconf: no file read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class CgroupReader:
    """`read()` gives the ceiling now: one pread per call, the limits re-read every `refresh_every` s."""

    def __init__(
        self,
        location: CgroupLocation | None,
        *,
        host_total: int | None = None,
        refresh_every: float = REFRESH_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location = location
        self._host_total = host_total if host_total is not None else (host_total_bytes() or 0)
        self._refresh_every = refresh_every
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshed: float | None = None
        self._limit: tuple[int, str] = (self._host_total, "host")
        self._oom_kills: int | None = None
        self._usage_path: Path | None = None
        self._usage_fd: int | None = None

    @classmethod
    def for_this_process(
        cls, proc_cgroup: str | Path = "/proc/self/cgroup", mountinfo: str | Path = "/proc/self/mountinfo", **kwargs
    ) -> CgroupReader:
        return cls(find_memory_cgroup(proc_cgroup, mountinfo), **kwargs)

    def read(self) -> MemoryCeiling:
        with self._lock:
            now = self._clock()
            if self._refreshed is None or now - self._refreshed >= self._refresh_every:
                self._refresh()
                self._refreshed = now
            usage = self._read_usage()
            limit, source = self._limit
            return MemoryCeiling(
                limit_bytes=limit,
                limit_source=source,
                usage_bytes=usage,
                oom_kills=self._oom_kills,
                cgroup=self.location.label(self.location.path) if self.location else None,
            )

    def close(self) -> None:
        with self._lock:
            self._open_usage(None)

    def _refresh(self) -> None:
        """The smallest limit from the process's cgroup up (the nearest wins a tie), capped by the host's RAM."""
        location = self.location
        if location is None:
            return
        limit_file, usage_file, oom_file = _FILES[location.version]
        best: tuple[int, str, Path] | None = None
        for cg_path, folder in location.chain:
            value = _limit_value(_read_text(folder / limit_file))
            if value is not None and (best is None or value < best[0]):
                best = (value, location.label(cg_path), folder)
        if location.version == 1:
            # A parent above what this mount shows can hold a smaller limit; v1 reports the one in force.
            hidden = _limit_value(_stat_field(_read_text(location.chain[0][1] / "memory.stat"), "hierarchical_memory_limit"))
            if hidden is not None and (best is None or hidden < best[0]):
                best = (hidden, location.label(location.path) + " (a parent's limit)", location.chain[0][1])
        if best is not None and self._host_total and best[0] >= self._host_total:
            best = None  # a limit above the machine's RAM is not the ceiling: the machine is
        self._limit = (best[0], best[1]) if best else (self._host_total, "host")
        self._open_usage((best[2] if best else location.chain[0][1]) / usage_file)
        self._oom_kills = _stat_field(_read_text(location.chain[0][1] / oom_file), "oom_kill")

    def _open_usage(self, path: Path | None) -> None:
        if path == self._usage_path and self._usage_fd is not None:
            return
        if self._usage_fd is not None:
            try:
                os.close(self._usage_fd)
            except OSError:
                pass
        self._usage_path, self._usage_fd = path, None
        if path is not None:
            try:
                self._usage_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._usage_fd = None

    def _read_usage(self) -> int | None:
        if self._usage_fd is None:
            return None
        try:
            return int(os.pread(self._usage_fd, 32, 0))
        except (OSError, ValueError):
            return None

    def __del__(self) -> None:
        if getattr(self, "_usage_fd", None) is not None:
            try:
                os.close(self._usage_fd)  # type: ignore[arg-type]
            except OSError:
                pass


def _read_text(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _limit_value(text: str | int | None) -> int | None:
    """Bytes, or None for "no limit" (v2 "max", v1's huge number) and for what cannot be read."""
    try:
        value = int(text) if text is not None else None  # int() takes " 123\n"; "max" is a ValueError
    except ValueError:
        return None
    return value if value is not None and 0 <= value < UNLIMITED else None


def _stat_field(text: str | None, name: str) -> int | None:
    """The number on the `name N` line of a flat-keyed cgroup file (memory.events, memory.stat, oom_control)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            try:
                return int(value)
            except ValueError:
                return None
    return None


# --------------------------------------------------------------------------- this process

_reader: CgroupReader | None = None
_reader_lock = threading.Lock()


def this_process() -> CgroupReader:
    """The reader for this process, found on first use."""
    global _reader
    if _reader is None:
        with _reader_lock:
            if _reader is None:
                _reader = CgroupReader.for_this_process()
    return _reader


def read_ceiling() -> MemoryCeiling:
    return this_process().read()


def previous_oom_kills_note(ceiling: MemoryCeiling | None = None) -> str | None:
    """A warning when the kernel has already OOM-killed a process in this memory cgroup (read at start:
    most likely an earlier run that went over the limit); None when it has not, or when it cannot tell."""
    ceiling = ceiling if ceiling is not None else read_ceiling()
    if not ceiling.oom_kills or ceiling.cgroup is None:
        return None
    kills = f"{ceiling.oom_kills} process{'es' if ceiling.oom_kills != 1 else ''}"
    limit = (
        f"its limit of {human_bytes(ceiling.limit_bytes)} ({ceiling.limit_source})"
        if ceiling.from_cgroup
        else f"the host's {human_bytes(ceiling.limit_bytes)}"
    )
    return (
        f"The kernel's OOM killer has already killed {kills} in this run's memory cgroup ({ceiling.cgroup}), "
        f"most likely an earlier run that went over {limit}. Watch the host gauge; if this run grows the same way, "
        "lower the batch size or ask for a larger memory limit."
    )
