"""The client end of a session's socket: say hello, read its hello, then lines out and commands in.

Stdlib only: front ends (the app, `attach --json`, `ls`, `stop`) import this, never the engine.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.protocol.wire import ClientHello, WireError

MAX_LINE = 256 << 20  # a full-resolution history replay of a long run can be tens of MB


class SessionGone(ConnectionError):
    """The session's socket closed (it ended, or was killed) or never answered."""


class SessionClient:
    def __init__(self, path: Path, hello: ClientHello, *, timeout: float | None = 10.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(os.fspath(path))
        except OSError as exc:
            self._sock.close()
            raise SessionGone(f"nothing answers on {path} ({exc.strerror or exc})") from None
        self._reader = self._sock.makefile("rb")
        self.send_line(hello.to_json())
        self.hello: dict[str, Any] = self._read_hello()
        self._sock.settimeout(None)

    def _read_hello(self) -> dict[str, Any]:
        for message in self.messages():
            if message.get("wire") == "hello":
                return message
            if message.get("event") == "error":
                raise WireError(str(message.get("message")))
        raise SessionGone(f"the session on {self.path} closed before saying hello")

    def raw_lines(self) -> Iterator[bytes]:
        """Each line as received (without its newline), until the session closes the socket."""
        while True:
            try:
                line = self._reader.readline(MAX_LINE)
            except (OSError, ValueError):
                return
            if not line or not line.endswith(b"\n"):
                return  # closed (a partial last line is no message)
            yield line.rstrip(b"\n")

    def messages(self) -> Iterator[dict[str, Any]]:
        for line in self.raw_lines():
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                yield data

    def send_line(self, text: str) -> None:
        try:
            self._sock.sendall(text.encode("utf-8") + b"\n")
        except OSError as exc:
            raise SessionGone(f"the session on {self.path} is gone ({exc.strerror or exc})") from None

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
