"""Fan events out to readers without ever blocking the writer.

The training thread publishes; readers (headless printer, event log, TUI log)
each get a bounded queue. A slow reader loses its oldest events (and is told how
many) instead of slowing training down.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from workbench.protocol.events import Event

E = TypeVar("E", bound=Event)


class Subscription(Generic[E]):
    """One reader's bounded queue of events."""

    def __init__(self, bus: EventBus, maxlen: int, accept: Callable[[Event], bool] | None) -> None:
        self._bus = bus
        self._items: deque[Event] = deque(maxlen=maxlen)
        self._wakeup = threading.Event()
        self._accept = accept
        self.dropped = 0

    def _offer(self, event: Event) -> None:
        if self._accept is not None and not self._accept(event):
            return
        if len(self._items) == self._items.maxlen:
            self.dropped += 1
        self._items.append(event)
        self._wakeup.set()

    def drain(self) -> list[Event]:
        """Everything queued so far, oldest first; never waits."""
        self._wakeup.clear()
        out: list[Event] = []
        while True:
            try:
                out.append(self._items.popleft())
            except IndexError:
                return out

    def wait(self, timeout: float | None = None) -> list[Event]:
        """Wait up to `timeout` seconds for at least one event, then drain."""
        if not self._items:
            self._wakeup.wait(timeout)
        return self.drain()

    def recent(self) -> tuple[Event, ...]:
        """What is queued, oldest first, left in place: a ring of the latest events (a late client's replay)."""
        return tuple(self._items)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.drain())

    def close(self) -> None:
        self._bus._remove(self)


class EventBus:
    """Publish/subscribe for engine events; `publish` is non-blocking and thread-safe."""

    def __init__(self) -> None:
        self._subscribers: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, maxlen: int = 50_000, accept: Callable[[Event], bool] | None = None) -> Subscription:
        sub: Subscription = Subscription(self, maxlen, accept)
        with self._lock:
            self._subscribers = (*self._subscribers, sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s is not sub)

    def publish(self, event: Event) -> None:
        # Reading the tuple is atomic; subscribers only swap it under the lock.
        for sub in self._subscribers:
            sub._offer(event)
