"""Fan events out to readers without ever blocking the writer.

The training thread publishes; readers (headless printer, event log, TUI log)
each get a bounded queue. A slow reader loses its oldest events (and is told how
many) instead of slowing training down.

Routine telemetry (a step, a memory sample, the ranks' summary) arrives at the step rate,
thousands a second for a small model. A reader woken for each one takes the GIL, and a
core, away from the training thread every step (measured: a 170 us step took 300 us with
two readers woken per step). So a reader may *linger*: woken by a routine event, it waits
up to `linger` seconds for more before it drains, unless something else arrives first
(a reload, a pause, an error, the exit): those are delivered at once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TextIO, TypeVar

from workbench.protocol.events import Event, Exit, Memory, Ranks, Step

ROUTINE = (Step, Memory, Ranks)  # telemetry at the step or sampler rate: a lingering reader batches these

E = TypeVar("E", bound=Event)


class Subscription(Generic[E]):
    """One reader's bounded queue of events."""

    def __init__(
        self, bus: EventBus, maxlen: int, accept: Callable[[Event], bool] | None, notify: threading.Event | None = None
    ) -> None:
        self._bus = bus
        self._items: deque[Event] = deque(maxlen=maxlen)
        self._wakeup = threading.Event()  # something is queued
        self._urgent = threading.Event()  # something other than routine telemetry is queued
        self._accept = accept
        self._notify = notify  # the reader's own wakeup, set for anything but routine telemetry
        self._flowing = False  # the last drain held only routine telemetry: steps are coming (see `wait`)
        self.dropped = 0

    def _offer(self, event: Event) -> None:
        if self._accept is not None and not self._accept(event):
            return
        if len(self._items) == self._items.maxlen:
            self.dropped += 1
        self._items.append(event)
        # Set only when clear: Event.set takes a lock and notifies (a few us, per step and reader). No wakeup is
        # lost: `drain` clears the flag before it empties the queue, and the item is queued before the check.
        if not self._wakeup.is_set():
            self._wakeup.set()
        if not isinstance(event, ROUTINE):
            self._urgent.set()
            if self._notify is not None:
                self._notify.set()

    def drain(self) -> list[Event]:
        """Everything queued so far, oldest first; never waits."""
        self._wakeup.clear()
        self._urgent.clear()
        out: list[Event] = []
        while True:
            try:
                out.append(self._items.popleft())
            except IndexError:
                self._flowing = bool(out) and all(isinstance(event, ROUTINE) for event in out)
                return out

    def wait(self, timeout: float | None = None, linger: float = 0.0) -> list[Event]:
        """Wait up to `timeout` seconds for at least one event, then drain.

        With `linger`, a queue holding only routine telemetry is drained up to `linger` seconds later (at once when
        anything else arrives meanwhile), so one wakeup carries a batch of steps rather than one. While steps flow (the
        last batch held only telemetry), the reader lingers straight away rather than waking for the first new step
        and then lingering: one wakeup a batch, not two (each wakeup of a thread beside training costs it, measured on a
        2-rank run; bench/RESULTS.md)."""
        if linger > 0 and self._flowing and not self._items:
            self._urgent.wait(linger)  # returns at once when anything but routine telemetry is queued
            return self.drain()
        if not self._items:
            self._wakeup.wait(timeout)
        if linger > 0 and self._items:
            self._urgent.wait(linger)  # returns at once when anything but routine telemetry is queued
        return self.drain()

    def recent(self) -> tuple[Event, ...]:
        """What is queued, oldest first, left in place: a ring of the latest events (a late client's replay)."""
        return tuple(self._items)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.drain())

    def close(self) -> None:
        self._bus._remove(self)


class EventBus:
    """Publish/subscribe for engine events; `publish` is non-blocking and thread-safe.

    `ends_at_exit`: the first `exit` event is the last one any reader gets. An engine's bus sets it: the sampler, a
    watchdog or a forced exit can still publish while the session winds down, and a stream's reader (stdout, the
    event log, a socket client) must be able to stop at `exit` without having lost anything that happened."""

    def __init__(self, *, ends_at_exit: bool = False) -> None:
        self._subscribers: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()
        self._ends_at_exit = ends_at_exit
        self._ended = False

    def subscribe(
        self, maxlen: int = 50_000, accept: Callable[[Event], bool] | None = None, notify: threading.Event | None = None
    ) -> Subscription:
        """A new reader's queue. `notify`: an event of the reader's own, set when anything but routine telemetry
        arrives (a reader that also waits for other things polls the routine ones on its own clock)."""
        sub: Subscription = Subscription(self, maxlen, accept, notify)
        with self._lock:
            self._subscribers = (*self._subscribers, sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)

    def publish(self, event: Event) -> None:
        if self._ended:
            return
        if self._ends_at_exit and type(event) is Exit:
            with self._lock:  # two exits (the worker's, a forced one) racing: one of them is published
                if self._ended:
                    return
                self._ended = True
        # Reading the tuple is atomic; subscribers only swap it under the lock.
        for sub in self._subscribers:
            sub._offer(event)


def write_until_exit(batch: list[Event], out: TextIO) -> bool:
    """Write a batch of events as JSON lines and flush; True once the `exit` event is written: a stream's last line
    (stdout, events.jsonl), whatever was queued behind it."""
    for event in batch:
        out.write(event.to_json() + "\n")
        if isinstance(event, Exit):
            out.flush()
            return True
    out.flush()
    return False
