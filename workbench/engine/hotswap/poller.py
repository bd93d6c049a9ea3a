"""Find saves by looking, where file events cannot see them (a network filesystem: hotswap/filesystem.py).

Only the files the session runs are looked at (the reloader's tracked files: the project's imported modules), never
the folder's tree: a project folder on shared storage often holds a dataset or checkpoints, and a poll that walked
them every second would cost more than training. Each file is opened before its attributes are read: NFS revalidates
a file's attributes on open (close-to-open consistency), where a bare stat may answer from the attribute cache for up
to a minute after another machine wrote it.

Time, size and inode miss a save that keeps the size within one tick of a coarse clock (sshfs and Lustre keep whole
seconds: `lr = 0.1` -> `lr = 0.2` a second after the last save). As git does for its index, a file written that
recently is also read and hashed, and compared by content until its time is old enough to tell.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# How often a project on a shared filesystem is looked at: a save shows within a second, and the look (an open and a
# fstat per file the session runs, a few dozen) costs microseconds of a core a second on a local disk.
SHARED_POLL_SECONDS = 1.0
RECENT_NS = 2_000_000_000  # a file written this recently is compared by content too (whole-second clocks, skew)
SETTLE_SECONDS = 0.1  # a changed file is looked at again after this, until it stops changing: not read mid-write
MAX_SETTLE_LOOKS = 20


@dataclass(frozen=True)
class Signature:
    """What changes when a file is saved: in place (time, size), by a new file written over it (inode), or, for a
    file written within RECENT_NS, its content."""

    mtime_ns: int
    size: int
    inode: int
    digest: bytes | None  # of the content, while the file is recent (and at the look after)
    recent: bool

    def differs(self, other: Signature) -> bool:
        if (self.mtime_ns, self.size, self.inode) != (other.mtime_ns, other.size, other.inode):
            return True
        return self.digest is not None and other.digest is not None and self.digest != other.digest


class SavePoller(threading.Thread):
    """Calls `on_change(paths, detected_at)` for the tracked files whose content may have changed since the last look
    (or that were deleted), like SourceWatcher. A file is first looked at when it becomes tracked, and reported then
    only if it no longer holds the source its running code came from (`live_source`)."""

    def __init__(self, files: Callable[[], list[Path]], on_change: Callable[[set[Path], float], None],
                 on_failure: Callable[[str], None], interval: float,
                 live_source: Callable[[Path], str | None] | None = None) -> None:
        super().__init__(name="vram-bench-save-poller", daemon=True)
        self._files = files
        self._live_source = live_source  # the source a file's running code came from, for its first look
        self._on_change = on_change
        self._on_failure = on_failure
        self.interval = interval
        self._seen: dict[Path, Signature | None] = {}
        self._failing: str | None = None  # the last failure said, so a lasting one is said once
        self._stop_event = threading.Event()
        self.ready = threading.Event()  # the first look is done: a save from now on is found

    def run(self) -> None:
        try:
            self._look_or_say()
            self.ready.set()
            while not self._stop_event.wait(self.interval):
                self._look_or_say()
        finally:
            self.ready.set()

    def _look_or_say(self) -> None:
        """A look; a failure (a stale NFS handle, the project's modules changing under the scan) is said once while it
        lasts, and the next look tries again: the session never stops finding saves for one bad moment."""
        try:
            self.look()
        except Exception as exc:  # noqa: BLE001 - keep looking
            message = f"{type(exc).__name__}: {exc}"
            if message != self._failing:
                self._failing = message
                self._on_failure(f"looking for saves failed ({message}); it is tried again every {self.interval:g} s, "
                                 "and r (or `reload`) applies edits by hand")
        else:
            self._failing = None

    def look(self) -> set[Path]:
        """One look at every tracked file; the changed ones are reported once they stop changing (and returned)."""
        changed = self._changed(self._files())
        for _ in range(MAX_SETTLE_LOOKS):
            if not changed or self._stop_event.wait(SETTLE_SECONDS):
                break
            if not self._changed(changed):  # nothing more was written: the save is whole
                break
        if changed:
            self._on_change(changed, time.monotonic())
        return changed

    def _changed(self, paths: list[Path] | set[Path]) -> set[Path]:
        out: set[Path] = set()
        for path in paths:
            old = self._seen.get(path)
            now = _signature(path, old is not None and old.recent)
            if path in self._seen:
                if now is not None and (old is None or old.differs(now)):
                    out.add(path)
                elif now is None and old is not None and not os.path.lexists(path):
                    out.add(path)  # deleted: the reload says the old code keeps running, as for a file event
            elif now is not None and self._saved_before_first_look(path):
                out.add(path)
            self._seen[path] = now
        return out

    def _saved_before_first_look(self, path: Path) -> bool:
        """A file first looked at up to an interval after it was imported (a module setup() imports): saved since,
        it holds other code than what runs."""
        if self._live_source is None:
            return False
        live = self._live_source(path)
        try:
            return live is not None and path.read_text(encoding="utf-8") != live
        except (OSError, UnicodeDecodeError):
            return False

    def stop(self) -> None:
        self._stop_event.set()


def _signature(path: Path, was_recent: bool) -> Signature | None:
    """The file's signature now; None when it is not there (or cannot be read: looked at again next time)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        recent = time.time_ns() - status.st_mtime_ns < RECENT_NS
        digest = None
        if recent or was_recent:  # and once more after: compared with the recent look's content
            with os.fdopen(os.dup(fd), "rb") as file:
                digest = hashlib.blake2b(file.read(), digest_size=16).digest()
        return Signature(status.st_mtime_ns, status.st_size, status.st_ino, digest, recent)
    except OSError:
        return None
    finally:
        os.close(fd)
