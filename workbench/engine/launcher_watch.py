"""Under torchrun: a rank whose launcher is gone stops, rather than train (and hold its GPU) with nobody to stop it.

torchrun's agent passes SIGTERM, SIGINT and SIGHUP on to its ranks, and ends them all when one fails. Killed
itself (SIGKILL, the out-of-memory killer, a node agent's cleanup of the launcher alone), it can do neither:
its ranks are re-parented to init (or a subreaper) and would train, or wait in a collective, forever. So each
rank remembers its parent, the launcher, and checks once a second whether it still has it; when not, it stops
the way a SIGTERM from the launcher would have stopped it (final snapshot on rank 0, then a clean exit, with
the quit's escalation for a step that never ends).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

CHECK_SECONDS = 1.0  # one getppid() a second: nothing next to a step, and the GPU is given back within a second


class LauncherWatch(threading.Thread):
    """Calls `on_gone(launcher_pid)` once, from its own thread, when this process's parent is no longer `launcher_pid`."""

    def __init__(self, on_gone: Callable[[int], None], launcher_pid: int | None = None,
                 interval: float = CHECK_SECONDS) -> None:
        super().__init__(name="vram-bench-launcher-watch", daemon=True)
        self.launcher_pid = os.getppid() if launcher_pid is None else launcher_pid
        self._on_gone = on_gone
        self._interval = interval
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self._interval):
            if os.getppid() != self.launcher_pid:
                self._on_gone(self.launcher_pid)
                return

    def stop(self) -> None:
        self._stop.set()
