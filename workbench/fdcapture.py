"""Keep native (C/C++) writes off the screen and off the protocol.

Python-level prints are routed by `output.OutputRouter`, but libraries such as
the profiler's kineto, CUDA or NCCL write straight to file descriptors 1 and 2.
In the TUI those bytes would tear the screen; in headless mode bytes on fd 1
would corrupt the JSON lines. These helpers move the descriptors aside.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from workbench.events import Print


class NativeStderrToEvents:
    """Point fd 2 at a pipe whose lines become `print` events; the terminal keeps a private fd.

    While active, `sys.__stderr__` is a file on a duplicate of the original fd 2,
    so a UI that draws on stderr (Textual does) still reaches the terminal.
    """

    def __init__(self, publish: Callable[[Print], None]) -> None:
        self._publish = publish
        self._saved_fd: int | None = None
        self._saved_dunder: TextIO | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> NativeStderrToEvents:
        try:
            sys.__stderr__.flush()  # type: ignore[union-attr]
            self._saved_fd = os.dup(2)
        except (OSError, AttributeError, ValueError):
            return self
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._saved_dunder = sys.__stderr__
        encoding = getattr(self._saved_dunder, "encoding", None) or "utf-8"
        sys.__stderr__ = open(os.dup(self._saved_fd), "w", encoding=encoding, errors="replace")  # type: ignore[misc]  # noqa: SIM115
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), name="vram-bench-native-stderr", daemon=True)
        self._reader.start()
        return self

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                self._publish(Print(stream="stderr", text=raw.decode("utf-8", "replace").rstrip("\n")))

    def __exit__(self, *exc: object) -> None:
        if self._saved_fd is None:
            return
        os.dup2(self._saved_fd, 2)  # closes the pipe's last writer: the reader thread ends
        os.close(self._saved_fd)
        if self._saved_dunder is not None:
            replaced = sys.__stderr__
            sys.__stderr__ = self._saved_dunder  # type: ignore[misc]
            try:
                replaced.close()  # type: ignore[union-attr]
            except OSError:
                pass
        if self._reader is not None:
            self._reader.join(1.0)


class ProtocolStdout:
    """Give the protocol a private copy of fd 1 and send everything else on fd 1 to stderr."""

    def __init__(self) -> None:
        self._saved_fd: int | None = None
        self.stream: TextIO = sys.stdout

    def __enter__(self) -> ProtocolStdout:
        try:
            sys.stdout.flush()
            self._saved_fd = os.dup(1)
            os.dup2(2, 1)
        except (OSError, ValueError, io.UnsupportedOperation):
            self._saved_fd = None
            return self
        self.stream = io.TextIOWrapper(os.fdopen(os.dup(self._saved_fd), "wb"), encoding="utf-8", line_buffering=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved_fd is None:
            return
        try:
            self.stream.flush()
        finally:
            self.stream.close()
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
