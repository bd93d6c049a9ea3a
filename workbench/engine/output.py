"""Route what the user's code prints into `print` events.

Prints from the training thread must never reach the terminal raw: in the TUI
they would tear the screen, in headless mode they would corrupt the JSON-lines
protocol. Threads registered here have their stdout/stderr turned into events;
every other thread writes through to the stream that was there before.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TextIO

from workbench.engine.printed_text import as_a_terminal_shows, is_only_control
from workbench.protocol.events import Print


_forwarding = threading.local()  # a retired stream's write is on its way through the current one


class _RoutedStream:
    """A stand-in for sys.stdout/sys.stderr that splits writes by thread."""

    def __init__(self, router: OutputRouter, stream_name: str, passthrough: TextIO) -> None:
        self._router = router
        self._stream_name = stream_name
        self._passthrough = passthrough
        self._partial: dict[int, str] = {}
        self.retired = False  # uninstalled: what still holds it writes where sys.stdout/sys.stderr are now

    def _current(self) -> TextIO | None:
        """Once retired, the stream in its place now: a logging handler, a tqdm bar or loguru made while the project
        was imported (early_output.py) kept this object, and their writes from the training thread went past the
        session's router to the raw stderr (an x-transformers trainer, ported: its bar and its log never reached
        the app's log)."""
        if not self.retired or getattr(_forwarding, "active", False):
            return None  # a stream put in place later that writes through to this one: its own passthrough, then
        now = sys.stdout if self._stream_name == "stdout" else sys.stderr
        return None if now is self else now

    def write(self, text: str) -> int:
        if (now := self._current()) is not None:
            _forwarding.active = True
            try:
                return now.write(text)
            finally:
                _forwarding.active = False
        ident = threading.get_ident()
        if ident not in self._router._threads:
            return self._passthrough.write(text)
        buffered = self._partial.pop(ident, "") + text
        *lines, rest = buffered.split("\n")
        for line in lines:
            self._router._emit(self._stream_name, line)
        if rest:
            self._partial[ident] = rest
        return len(text)

    def flush(self) -> None:
        if (now := self._current()) is not None:
            _forwarding.active = True
            try:
                now.flush()
            finally:
                _forwarding.active = False
            return
        rest = self._partial.pop(threading.get_ident(), "")
        if rest:
            self._router._emit(self._stream_name, rest)
        try:
            self._passthrough.flush()
        except (ValueError, OSError):
            pass

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._passthrough, name)


class OutputRouter:
    """Installs routed streams; `capture_thread` marks a thread whose output becomes events."""

    def __init__(self, publish: Callable[[Print], None], *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._publish = publish
        self._threads: set[int] = set()
        self._stdout_passthrough = stdout
        self._stderr_passthrough = stderr
        self._installed: tuple[_RoutedStream, _RoutedStream] | None = None
        self._previous: tuple[TextIO, TextIO] | None = None

    def _emit(self, stream: str, text: str) -> None:
        if not is_only_control(text):
            self._publish(Print(stream=stream, text=as_a_terminal_shows(text)))

    def install(self) -> None:
        """Wrap whatever sys.stdout/sys.stderr are now (call after a UI swaps them)."""
        if self._installed is not None:
            return
        _INSTALLED.add(self)
        self._previous = (sys.stdout, sys.stderr)
        out = _RoutedStream(self, "stdout", self._stdout_passthrough or sys.stdout)
        err = _RoutedStream(self, "stderr", self._stderr_passthrough or sys.stderr)
        self._installed = (out, err)
        sys.stdout, sys.stderr = out, err  # type: ignore[assignment]

    def uninstall(self, forward: bool = False) -> None:
        """Put the previous streams back, unless someone else has replaced ours since. `forward`: what still holds ours
        writes where sys.stdout/sys.stderr are then (the import's streams, early_output.py); otherwise it goes on as
        before (a session's, closing: a last print of its training thread stays an event, off the terminal)."""
        if self._installed is None or self._previous is None:
            return
        _INSTALLED.discard(self)
        out, err = self._installed
        for routed in (out, err):
            for ident in list(routed._partial):
                self._emit(routed._stream_name, routed._partial.pop(ident))
            routed.retired = forward
        if sys.stdout is out:
            sys.stdout = self._previous[0]
        if sys.stderr is err:
            sys.stderr = self._previous[1]
        self._installed = None

    def after_fork_in_child(self) -> None:
        """In a process the user's code forked (DataLoader workers): nobody reads this process's events, and
        a lock another thread held at the fork stays held here. Print straight to fds 1 and 2 instead, on
        new stream objects: in the app those descriptors feed the log, headless fd 1 goes to stderr."""
        self._threads.clear()
        self._installed = None
        _INSTALLED.discard(self)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115

    def capture_thread(self, ident: int | None = None) -> None:
        self._threads.add(threading.get_ident() if ident is None else ident)

    def release_thread(self, ident: int | None = None) -> None:
        self._threads.discard(threading.get_ident() if ident is None else ident)


_INSTALLED: weakref.WeakSet[OutputRouter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for router in list(_INSTALLED):
        router.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
