"""The socket protocol's framing: JSON lines, a versioned hello each way, and who the peer is.

Server to client: one JSON object per line. Events are exactly the headless schema
(`{"event": ...}`, workbench/protocol/events.py); the transport's own messages carry `"wire"`
instead: `hello` (the session's facts, its status and a replay of its history),
`status` (the status bar's facts, sent when they change), `versions` (the versions
table), `history` (a replay asked for later) and `dropped` (events this client was
too slow to take). Client to server: a hello first, then the headless commands
(`pause`, `profile 5`, ...) one per line, or `{"wire": ...}` requests. Nothing read
from a socket is ever unpickled or executed: lines are parsed as JSON or as a command word.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

PROTOCOL = 1
HISTORY_CHOICES = ("screen", "full", "none")


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The connecting process's credentials, as the kernel recorded them at connect (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


@dataclass(frozen=True)
class ClientHello:
    """What a client says first: what it is, and how much history it wants."""

    client: str = "client"
    history: str = "screen"  # screen: downsampled to what a screen shows; full: every point; none
    max_points: int = 2000
    protocol: int = PROTOCOL

    def to_json(self) -> str:
        return wire_line("hello", protocol=self.protocol, client=self.client, history=self.history,
                         max_points=self.max_points)


class WireError(ValueError):
    """A line that is not a message this end understands; said to the peer, never fatal."""


def wire_line(kind: str, **fields: Any) -> str:
    return json.dumps({"wire": kind, **fields}, separators=(",", ":"), allow_nan=False)


def parse_client_hello(data: dict[str, Any]) -> ClientHello:
    protocol = data.get("protocol")
    if protocol != PROTOCOL:
        raise WireError(f"this session speaks protocol {PROTOCOL}, the client {protocol!r}: use the same vram-bench version on both ends")
    client = str(data.get("client", "client"))[:40]
    history = data.get("history", "screen")
    if history not in HISTORY_CHOICES:
        raise WireError(f"hello: history must be one of {', '.join(HISTORY_CHOICES)}, not {history!r}")
    max_points = data.get("max_points", 2000)
    if not isinstance(max_points, int) or not 10 <= max_points <= 1_000_000:
        raise WireError("hello: max_points must be a whole number from 10 to 1,000,000")
    return ClientHello(client=client, history=history, max_points=max_points)


def parse_json_line(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WireError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise WireError("a JSON message must be an object")
    return data
