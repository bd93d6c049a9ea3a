"""Warn when a step (or evaluate()) runs far longer than usual: a hung data loader, a deadlock, an endless loop.

It only reads two values the training thread writes (when the running step began,
and recent step times), and says once per step what the user can do: interrupt.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from workbench.protocol.events import Error, Event
from workbench.engine.suspension import SuspendedTime
from workbench.engine.whereabouts import RankWatch
from workbench.engine.worker import TrainingWorker


class StepWatchdog(threading.Thread):
    def __init__(
        self, worker: TrainingWorker, publish: Callable[[Event], None], *, factor: float, minimum: float, every: float = 0.5,
        rank_watch: RankWatch | None = None,
    ) -> None:
        super().__init__(name="vram-bench-watchdog", daemon=True)
        self._rank_watch = rank_watch  # under torchrun: where every rank is, when one holds the others (whereabouts.py)
        self._store_failed = False
        self._worker = worker
        self._publish = publish
        self._factor = factor
        self._minimum = minimum
        self._every = every
        self._stop_event = threading.Event()
        self._warned_for: float | None = None

    def run(self) -> None:
        suspended = SuspendedTime()
        while not self._stop_event.wait(self._every):
            suspended.tick(self._every)
            if self._rank_watch is not None:
                self._watch_ranks(suspended)
                if self._rank_watch.reports:
                    continue  # rank 0's report says what this warning would, with every rank's place
            self._watch_evaluate(suspended)
            started = self._worker.step_started
            history = list(self._worker.step_ms_history)
            if started is None or started == self._warned_for or len(history) < 3:
                continue
            # Time the whole process was stopped (SIGSTOP, a suspended job) is no step's doing.
            running = time.monotonic() - started - suspended.since(started)
            median = statistics.median(history) / 1000
            if running >= max(self._minimum, self._factor * median):
                self._warned_for = started
                self._publish(
                    Error(
                        where="slow step",  # a warning: training is not paused
                        message=f"step {self._worker.step + 1} has run for {running:.0f} s, {running / max(median, 1e-6):.0f}x "
                        f"its median ({median:.2f} s): if it is stuck, press i (command `interrupt`) to stop it; "
                        "the model stays",
                    )
                )

    def _watch_evaluate(self, suspended: SuspendedTime) -> None:
        """The user's evaluate() has no median to compare with: it is slow once it runs as long as a slow step's
        minimum, and said once per call."""
        started = self._worker.evaluate_started
        if started is None or started == self._warned_for:
            return
        running = time.monotonic() - started - suspended.since(started)
        if running >= self._minimum:
            self._warned_for = started
            self._publish(Error(where="slow step", message=f"evaluate() has run for {running:.0f} s: if it is stuck, "
                                "press i (command `interrupt`) to stop it; training goes on, the model stays"))

    def _watch_ranks(self, suspended: SuspendedTime) -> None:
        assert self._rank_watch is not None
        try:
            self._rank_watch.tick(suspended)
        except Exception as exc:  # noqa: BLE001 - the store gone (the launcher ended): the steps' own errors say it
            if not self._store_failed:
                self._store_failed = True
                self._publish(Error(where="waiting", message=f"the ranks' places cannot be read or written in the job's "
                                    f"store ({type(exc).__name__}: {exc}); a held rank will not be reported"))

    def stop(self) -> None:
        self._stop_event.set()
