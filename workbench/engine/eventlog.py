"""Append every event to the run folder's `events.jsonl` (the TUI's record of a session)."""

from __future__ import annotations

import threading
from pathlib import Path

from workbench.protocol.eventbus import EventBus, write_until_exit

# Steps and memory samples are written in batches at most this far apart (anything else at once): one wakeup per step
# would take the GIL from the training thread at every step (workbench/protocol/eventbus.py).
STEP_BATCH_SECONDS = 0.5


class EventLogWriter(threading.Thread):
    def __init__(self, bus: EventBus, path: Path) -> None:
        super().__init__(name="vram-bench-event-log", daemon=True)
        self._events = bus.subscribe(maxlen=1_000_000)
        self._path = path
        self._stop_event = threading.Event()

    def run(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._path.open("a", encoding="utf-8") as out:
            while True:
                batch = self._events.wait(timeout=0.5, linger=STEP_BATCH_SECONDS)
                if write_until_exit(batch, out) or (self._stop_event.is_set() and not batch):
                    break
        self._events.close()

    def stop(self) -> None:
        self._stop_event.set()
