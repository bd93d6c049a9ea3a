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

from workbench.engine.printed_text import as_a_terminal_shows, is_only_control
from workbench.protocol.events import Print


class NativeOutputToEvents:
    """Point fd 1 or 2 at a pipe whose lines become `print` events; the terminal keeps a private fd.

    While active, `sys.__stdout__`/`sys.__stderr__` is a file on a duplicate of the
    original fd, so a UI that draws there (Textual draws on stderr) still reaches the
    terminal, while C code writing to the descriptor (kineto, NCCL, a `printf`) and
    handlers that kept the original stream reach the log instead of tearing the screen.
    """

    _DUNDER = {1: "__stdout__", 2: "__stderr__"}

    def __init__(self, publish: Callable[[Print], None], fd: int = 2) -> None:
        self._publish = publish
        self._fd = fd
        self._stream = "stdout" if fd == 1 else "stderr"
        self._saved_fd: int | None = None
        self._saved_dunder: TextIO | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> NativeOutputToEvents:
        dunder = self._DUNDER[self._fd]
        try:
            getattr(sys, dunder).flush()
            self._saved_fd = os.dup(self._fd)
        except (OSError, AttributeError, ValueError):
            return self
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, self._fd)
        os.close(write_fd)
        self._saved_dunder = getattr(sys, dunder)
        encoding = getattr(self._saved_dunder, "encoding", None) or "utf-8"
        setattr(sys, dunder, open(os.dup(self._saved_fd), "w", encoding=encoding, errors="replace"))  # noqa: SIM115
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), name=f"vram-bench-native-{self._stream}", daemon=True)
        self._reader.start()
        return self

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                text = raw.decode("utf-8", "replace").rstrip("\n")
                if not is_only_control(text):
                    self._publish(Print(stream=self._stream, text=as_a_terminal_shows(text)))

    def __exit__(self, *exc: object) -> None:
        if self._saved_fd is None:
            return
        dunder = self._DUNDER[self._fd]
        try:
            sys.stdout.flush() if self._fd == 1 else sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(self._saved_fd, self._fd)  # closes the pipe's last writer: the reader thread ends
        os.close(self._saved_fd)
        if self._saved_dunder is not None:
            replaced = getattr(sys, dunder)
            setattr(sys, dunder, self._saved_dunder)
            try:
                replaced.close()
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
            try:
                self.stream.close()  # flushes first, and closes the descriptor even when that fails
            except OSError:
                # The reader is gone (headless.py quit for it), or stdout is on a full disk (headless.py said so): what
                # is still buffered cannot go anywhere, and the run has ended as it should.
                pass
        finally:
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
