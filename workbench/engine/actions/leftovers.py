"""Temp files a killed writer left behind: found at the next start, removed, and said.

Snapshots and CUDA memory snapshots are written to a temp file that is renamed into
place once complete. A writer killed in between (SIGKILL, an OOM kill, a power cut)
leaves that temp file for good: a few hundred MB a snapshot. Each temp name carries
its writer's pid (`.tmp-<pid>-....pt`), so a later start removes only files whose
writer is gone, never a file another live session is still writing.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

_LEFTOVER = re.compile(r"^\.tmp-(\d+)-.+\.(pt|pickle|json|dcp)$")  # .dcp: a sharded snapshot's folder


def temp_prefix() -> str:
    """The prefix of this process's temp files (`tempfile.mkstemp(prefix=...)`)."""
    return f".tmp-{os.getpid()}-"


@dataclass(frozen=True)
class Leftover:
    path: Path
    bytes: int
    writer_pid: int


def remove_leftovers(folders: list[Path]) -> list[Leftover]:
    """Remove the temp files in `folders` whose writer process no longer runs; what was removed."""
    removed = []
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            match = _LEFTOVER.match(path.name)
            if match is None:
                continue
            pid = int(match.group(1))
            if pid == os.getpid() or psutil.pid_exists(pid):
                continue  # being written (or a pid reused: keeping a file is the safe mistake)
            try:
                if path.is_dir():
                    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    shutil.rmtree(path)
                else:
                    size = path.stat().st_size
                    path.unlink()
            except OSError:
                continue
            removed.append(Leftover(path, size, pid))
    return removed
