"""Watch the project folder with watchfiles and report saved Python files.

Editors save in different ways (write in place, or write a temp file and rename
it over the original); either way the final path shows up as added or modified,
and the reload thread reads whatever is on disk then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import watchfiles

from workbench.engine.project import is_project_file

# watchfiles waits `step` ms without new changes before yielding a batch, and at most
# `debounce` ms in all. Its defaults (50 / 1600) are far too slow for a save-to-swap loop.
DEBOUNCE_MS = 200
STEP_MS = 20  # each step wakes the watcher (and takes the GIL): 20 ms keeps an idle session under 2% of a core


class _ProjectFilter(watchfiles.DefaultFilter):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root

    def __call__(self, change: watchfiles.Change, path: str) -> bool:
        return path.endswith(".py") and super().__call__(change, path) and is_project_file(Path(path), self._root)


class SourceWatcher(threading.Thread):
    """Calls `on_change(paths, detected_at)` for every batch of saved .py files."""

    def __init__(
        self,
        root: Path,
        on_change: Callable[[set[Path], float], None],
        on_failure: Callable[[str], None],
        *,
        debounce_ms: int = DEBOUNCE_MS,
        step_ms: int = STEP_MS,
    ) -> None:
        super().__init__(name="vram-bench-watcher", daemon=True)
        self._root = root
        self._on_change = on_change
        self._on_failure = on_failure
        self._debounce_ms = debounce_ms
        self._step_ms = step_ms
        self._stop_event = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            for changes in watchfiles.watch(
                self._root,
                watch_filter=_ProjectFilter(self._root),
                debounce=self._debounce_ms,
                step=self._step_ms,
                stop_event=self._stop_event,
                rust_timeout=200,
                yield_on_timeout=True,
                raise_interrupt=False,
            ):
                self.ready.set()
                if changes:
                    self._on_change({Path(p) for _, p in changes}, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - the session must outlive a broken watcher
            self._on_failure(f"watching {self._root} for saves failed ({exc}); press r (or send `reload`) to apply edits by hand")
        finally:
            self.ready.set()

    def stop(self) -> None:
        self._stop_event.set()
