"""Append every event to the run folder's `events.jsonl` (the TUI's record of a session).

A write that fails (the disk full, the run folder gone or not a folder) once ended this thread with a traceback on
stderr, which a detached session's user never sees: the log stopped, and nothing said so, while `vram-bench runs`
and the docs call it the run's record. Now a failure never ends the log or the run: it is said once, as a `run
folder` warning, the writer tries again with each later batch, and when a write succeeds again it says how many
events the log lacks and from when.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TextIO

from workbench.protocol.eventbus import EventBus, write_until_exit
from workbench.protocol.events import Error, Event

# Steps and memory samples are written in batches at most this far apart (anything else at once): one wakeup per step
# would take the GIL from the training thread at every step (workbench/protocol/eventbus.py).
STEP_BATCH_SECONDS = 0.5
WHERE = "run folder"  # a warning (events.WARNINGS): the run goes on


class EventLogWriter(threading.Thread):
    def __init__(self, bus: EventBus, path: Path) -> None:
        super().__init__(name="vram-bench-event-log", daemon=True)
        self._events = bus.subscribe(maxlen=1_000_000)
        self._publish = bus.publish
        self._path = path
        self._stop_event = threading.Event()
        self._out: TextIO | None = None
        self._failing = False  # since a write failed, until one succeeds
        self._missing = 0  # events not written since then
        self._missing_since: float | None = None

    def run(self) -> None:
        try:
            while True:
                batch = self._events.wait(timeout=0.5, linger=STEP_BATCH_SECONDS)
                if self._write(batch) or (self._stop_event.is_set() and not batch):
                    break
        finally:
            self._close()
            self._events.close()

    def stop(self) -> None:
        self._stop_event.set()

    def _write(self, batch: list[Event]) -> bool:
        """Write a batch; True once the `exit` event is written. A failure is said and counted, never raised."""
        if not batch and self._out is None:
            return False
        try:
            out = self._out or self._open()
            ended = write_until_exit(batch, out)
        except OSError as exc:
            self._failed(batch, exc)
            return any(event.name == "exit" for event in batch)
        if self._failing:
            self._recovered()
        return ended

    def _open(self) -> TextIO:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        out = self._path.open("a", encoding="utf-8")
        try:
            if out.tell() > 0 and _last_byte(self._path) != b"\n":
                out.write("\n")  # a failed write may have left half a line: the next event starts a line of its own
        except OSError:
            out.close()
            raise
        self._out = out
        return out

    def _close(self) -> None:
        out, self._out = self._out, None
        if out is not None:
            try:
                out.close()
            except OSError:
                pass  # what it held back is counted as missing already, or could not be written anyway

    def _failed(self, batch: list[Event], exc: OSError) -> None:
        self._close()
        self._missing += len(batch)
        if not self._failing:
            self._failing = True
            self._missing_since = batch[0].time if batch else time.time()
            self._publish(Error(where=WHERE, message=(
                f"cannot write the run's event log {self._path} ({exc.strerror or exc}): events from here on are not in "
                "it until a write succeeds (tried again every batch); training goes on")))

    def _recovered(self) -> None:
        since = time.strftime("%H:%M:%S", time.localtime(self._missing_since or time.time()))
        missing, self._missing, self._missing_since, self._failing = self._missing, 0, None, False
        self._publish(Error(where=WHERE, message=(
            f"the run's event log {self._path} is written again: {missing} events from {since} on are not in it")))


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1)
