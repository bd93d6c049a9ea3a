"""Find saves by looking, where file events cannot see them (a network filesystem: workbench/engine/hotswap/filesystem.py).

Only the files the session runs are looked at (the reloader's tracked files: the project's imported modules), never
the folder's tree: a project folder on shared storage often holds a dataset or checkpoints, and a poll that walked
them every second would cost more than training. Each file is opened before its attributes are read: NFS revalidates
a file's attributes on open (close-to-open consistency), where a bare stat may answer from the attribute cache for up
to a minute after another machine wrote it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

# How often a project on a shared filesystem is looked at: a save shows within a second, and the look (an open and a
# fstat per file the session runs, a few dozen) costs microseconds of a core a second on a local disk.
SHARED_POLL_SECONDS = 1.0

Signature = tuple[int, int, int] | None  # (mtime ns, size, inode); None: the file is not there


class SavePoller(threading.Thread):
    """Calls `on_change(paths, detected_at)` for the tracked files whose content may have changed since the last look,
    like SourceWatcher; a file is first looked at when it becomes tracked, and only a later change is reported."""

    def __init__(self, files: Callable[[], list[Path]], on_change: Callable[[set[Path], float], None],
                 on_failure: Callable[[str], None], interval: float) -> None:
        super().__init__(name="vram-bench-save-poller", daemon=True)
        self._files = files
        self._on_change = on_change
        self._on_failure = on_failure
        self.interval = interval
        self._seen: dict[Path, Signature] = {}
        self._stop_event = threading.Event()
        self.ready = threading.Event()  # the first look is done: a save from now on is found

    def run(self) -> None:
        try:
            self.look()
            self.ready.set()
            while not self._stop_event.wait(self.interval):
                self.look()
        except Exception as exc:  # noqa: BLE001 - the session must outlive a broken poller
            self._on_failure(f"looking for saves failed ({type(exc).__name__}: {exc}); press r (or send `reload`) "
                             "to apply edits by hand")
        finally:
            self.ready.set()

    def look(self) -> set[Path]:
        """One look at every tracked file; the changed ones are reported (and returned)."""
        changed: set[Path] = set()
        for path in self._files():
            now = _signature(path)
            if path in self._seen and self._seen[path] != now and now is not None:
                changed.add(path)
            self._seen[path] = now
        if changed:
            self._on_change(changed, time.monotonic())
        return changed

    def stop(self) -> None:
        self._stop_event.set()


def _signature(path: Path) -> Signature:
    """What changes when a file is saved: in place (time, size) or by writing a new file over it (inode)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
    finally:
        os.close(fd)
    return status.st_mtime_ns, status.st_size, status.st_ino
