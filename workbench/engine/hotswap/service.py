"""The reload thread: prepares change sets off the training thread.

Saves from the watcher and `reload` commands arrive here.
Failures are reported at once as `reload` events (the old code keeps running);
successes are handed to the training thread, which applies them between steps.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.protocol.events import Event, Reload
from workbench.engine.hotswap.planner import ChangeSet, ReloadError
from workbench.engine.hotswap.reloader import Reloader
from workbench.engine.project import read_source

_STOP = object()
_SETTLE_ATTEMPTS = 3
_SETTLE_SECONDS = 0.05
_RESCAN = object()


@dataclass(frozen=True)
class SourceUnchanged:
    """A save (or `reload`) found the file's code equal to the live code."""

    path: Path
    detected_at: float
    manual: bool


class ReloadService(threading.Thread):
    def __init__(
        self, reloader: Reloader, submit: Callable[[ChangeSet | SourceUnchanged], None], publish: Callable[[Event], None],
        announce: Callable[[Path, str], None] | None = None, on_start: Callable[[], None] | None = None,
    ) -> None:
        """`announce`: told each source as it is read, before it is planned (under torchrun, rank 0 posts it so the
        other ranks plan it at the same time: workbench/engine/prepare_ahead.py). `on_start`: run first on the reload
        thread (its CUDA device: planning runs a saved file's new imports)."""
        super().__init__(name="vram-bench-reload", daemon=True)
        self._reloader = reloader
        self._announce = announce
        self._on_start = on_start
        self._submit = submit
        self._publish = publish
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()

    # Called from any thread -------------------------------------------------------------
    def files_changed(self, paths: set[Path], detected_at: float) -> None:
        self._requests.put((paths, detected_at))

    def rescan(self) -> None:
        self._requests.put(_RESCAN)

    def stop(self) -> None:
        self._requests.put(_STOP)

    # The reload thread ------------------------------------------------------------------
    def run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        self._reloader.warm_up()
        while True:
            request = self._requests.get()
            if request is _STOP:
                return
            if request is _RESCAN:
                paths, detected_at, manual = set(self._reloader.tracked_files()), time.monotonic(), True
            else:
                (paths, detected_at), manual = request, False  # type: ignore[misc]
            for path in sorted(paths):
                self._prepare(path, detected_at, manual)

    def _prepare(self, path: Path, detected_at: float, manual: bool) -> None:
        relative = self._reloader.project.relative(path)
        try:
            changeset = self._prepare_settled(path, detected_at)
        except ReloadError as exc:
            self._publish(
                Reload(
                    ok=False,
                    file=relative,
                    error=exc.message,
                    line=exc.line,
                    ms=(time.monotonic() - detected_at) * 1000,
                    code_version=self._reloader.version,
                    notes=("the old code keeps running",),
                )
            )
            return
        except Exception as exc:  # noqa: BLE001 - a bug in planning must not kill reloads
            self._publish(
                Reload(ok=False, file=relative, error=f"internal error while planning: {exc!r}", code_version=self._reloader.version)
            )
            return
        if changeset is None:
            # The file holds the live code. The training thread says so, and drops a change it held
            # back for a rebuild: that change is no longer on disk, so no rebuild may apply it.
            self._submit(SourceUnchanged(path, detected_at, manual))
            return
        self._submit(changeset)

    def _prepare_settled(self, path: Path, detected_at: float) -> ChangeSet | None:
        """Prepare; if it fails on a file that is still being written, wait for the write to finish."""
        for attempt in range(_SETTLE_ATTEMPTS):
            try:
                return self._reloader.prepare(path, detected_at, announce=self._announce)
            except ReloadError as exc:
                if attempt == _SETTLE_ATTEMPTS - 1 or exc.source is None:
                    raise
                time.sleep(_SETTLE_SECONDS)
                try:
                    if read_source(path) == exc.source:
                        raise  # the file is as it was: a real error in what the user saved
                except (OSError, UnicodeDecodeError, SyntaxError):
                    raise exc from None
        return None
