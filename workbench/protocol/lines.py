"""Command lines read from a file descriptor with `os.read`, as bytes, split and decoded here.

Why not `for line in sys.stdin`: a thread blocked there holds the lock of stdin's buffered
reader. When the user's code forks meanwhile (a DataLoader with `num_workers=2`), the child
inherits that lock still held by a thread that does not exist in the child, and
multiprocessing's bootstrap closes `sys.stdin` there: the child hangs forever, and the
parent waits forever for its batches. `os.read` holds no Python lock while it waits.

Reading bytes also means one invalid UTF-8 byte cannot kill the reader (a strict text
stream raises UnicodeDecodeError out of the loop): such a line is decoded leniently and
flagged, and reading goes on. A line is capped, so a stream without newlines cannot
grow memory without bound: a longer line is reported once and skipped up to its newline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

MAX_LINE_BYTES = 1 << 20  # 1 MiB: no command comes near this
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Line:
    """One line without its newline; `problem` says why it cannot be used as a command, if it cannot."""

    text: str
    problem: str | None = None


def read_lines(
    fd: int, max_bytes: int = MAX_LINE_BYTES, chunk: int = READ_CHUNK, *, unterminated_last: bool = True
) -> Iterator[Line]:
    """Lines from `fd` until end of input (or a read error, e.g. the descriptor was closed).

    `unterminated_last=False` drops a last line without its newline: on a socket, that is
    a message whose sender died while writing it, not a message."""
    pending = bytearray()
    skipping = False  # inside an overlong line, already reported: drop bytes up to its newline
    while True:
        try:
            data = os.read(fd, chunk)
        except OSError:
            data = b""
        if not data:
            break
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if not skipping and len(pending) + len(piece) > max_bytes:
                skipping = True
                pending.clear()
                yield Line("", f"a command line longer than {max_bytes:,} bytes was skipped")
            if not skipping:
                pending += piece
            if end < 0:
                break
            if not skipping:
                yield _decode(bytes(pending))
            pending.clear()
            skipping = False
            start = end + 1
    if pending and not skipping and unterminated_last:
        yield _decode(bytes(pending))  # a last line without a newline


def _decode(raw: bytes) -> Line:
    if raw.endswith(b"\r"):
        raw = raw[:-1]  # CRLF from a script written on Windows
    try:
        return Line(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", errors="replace")
        shown = repr(raw[:40]) + ("..." if len(raw) > 40 else "")
        return Line(text, f"a command line is not valid UTF-8 (byte {exc.start}: {shown}); it was ignored")
