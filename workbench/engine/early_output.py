"""What the project prints before its session exists: while it is imported.

Real trainers print at import (a banner, the parsed arguments, a config dump).
That output must neither reach the protocol's stdout nor vanish: it is kept as
`print` events and published once the session starts, right after `start`, so
the app's log and the headless stream show it where the user expects it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

from workbench.protocol.events import Event, Print
from workbench.engine.output import OutputRouter


class EarlyOutput:
    """A publish function that buffers until `connect` gives it the session's bus."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._publish: Callable[[Event], None] | None = None

    def publish(self, event: Event) -> None:
        with self._lock:
            if self._publish is None:
                self._pending.append(event)
                return
            publish = self._publish
        publish(event)

    def connect(self, publish: Callable[[Event], None]) -> None:
        """From now on events go to `publish`; the buffered ones go first, in order."""
        with self._lock:
            pending, self._pending = self._pending, []
            for event in pending:
                publish(event)
            self._publish = publish

    def text(self) -> str:
        """The buffered output as the user would have seen it (for a project that failed to import)."""
        with self._lock:
            return "".join(e.text + "\n" for e in self._pending if isinstance(e, Print))

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Route this thread's sys.stdout and sys.stderr writes into the buffer while the block runs."""
        router = OutputRouter(self.publish)
        router.install()
        router.capture_thread()
        try:
            yield
        finally:
            router.release_thread()
            router.uninstall(forward=True)  # a logging handler or a tqdm bar made at import writes through the session's

    def replay_to_stderr(self) -> None:
        """Show what was printed when no session will ever publish it (the import failed)."""
        text = self.text()
        terminal = sys.__stderr__  # fd 2 itself may be a pipe into the log by now
        if text and terminal is not None:
            terminal.write(text)
            terminal.flush()
