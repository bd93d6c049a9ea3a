"""Python's cyclic garbage collector in the app's process: off the path from a key to its frame.

An attached app (`vram-bench attach`, or `run` in a terminal) is a process of its own, holding
Textual, rich, numpy and the app: about 78,000 objects the collector tracks. Profiled while
training on both cores of a 2-core machine (the help key, 40 presses): a full (generation 2)
collection walked them all on the UI thread, about 40-60 ms of CPU and 130 ms of wall time
(median of 16); opening the help makes some 50,000 objects in one frame (strips and their
caches), which ran about 20 young collections inside the press and set off the full one
whenever it was nearly due: 6 of the 8 presses slower than 60 ms had one inside. The old
in-process app did not pay this: the engine froze its process after setup()
(workbench/engine/memory/gc_freeze.py), Textual's objects included.

Measured with `python bench/session_attach.py --only latency` (help p95 attached, median of
runs in one sitting, load 2-3): 123 ms before, 71 with the freeze alone, 32 with the hold
alone, 36 with both. The hold is what moves the figure; the freeze shortens every full
collection (median 130 ms -> 17-33 ms wall), so a key that arrives while one already runs
waits less.

- `freeze_survivors`: once the app is up, collect, then move every survivor into the permanent
  generation (`gc.freeze()`), which collections skip: a full collection then walks only what was
  made since. `release` gives them back when the app leaves (a process that runs several apps,
  the tests, does not keep them). Only for a remote source: an in-process session freezes its
  own process after setup() and releases it when it ends.
- `CollectorHold`: an action run from a key (or the palette, or a click) turns the automatic
  collector off until the screen has been refreshed after it (never longer than `HOLD_MAX`), so
  a collection that falls due while the answer is drawn runs after that frame, not inside it.
  Nothing is freed later than that; reference counting frees as always; `gc.collect()` still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.app import App


def freeze_survivors() -> int:
    """Collect, then freeze every survivor (only live objects, never garbage); how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release() -> None:
    """Back to ordinary collection: frozen objects rejoin the oldest generation."""
    gc.unfreeze()


HOLD_MAX = 0.5  # seconds: the collector is never held off longer than this (keys back to back)


class CollectorHold:
    """Automatic collections wait while an action runs and its frame is drawn; explicit `gc.collect()` still works."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: float | None = None  # when this hold turned the collector off; None: not holding

    @property
    def holding(self) -> bool:
        return self._since is not None

    def hold(self) -> None:
        """An action starts: turn automatic collection off (unless someone else already did: theirs to turn on)."""
        if self._since is None:
            if gc.isenabled():
                gc.disable()
                self._since = since = self._clock()
                with contextlib.suppress(RuntimeError):  # no event loop (a plain call): released by the caller
                    asyncio.get_running_loop().call_later(HOLD_MAX, self._expire, since)
        elif self._clock() - self._since > HOLD_MAX:
            self.release()  # actions back to back: let the collection that is due run now, between them

    def _expire(self, since: float) -> None:
        """HOLD_MAX after a hold began: let go if that hold is still on (an action that awaits, a frame that never came)."""
        if self._since == since:
            self.release()

    def release_after_refresh(self, app: App[object]) -> None:
        """The action has run: collections resume once the screen was refreshed after it (at once if the app is closing)."""
        if self._since is not None and not app.call_after_refresh(self.release):
            self.release()

    def release(self) -> None:
        if self._since is not None:
            self._since = None
            gc.enable()
