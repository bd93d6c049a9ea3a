"""The session's Unix socket: front ends attach, watch, send commands, and leave; training never waits.

One listening socket (0600, in the user's 0700 runtime folder, workbench/protocol/registry.py);
a peer is accepted only if the kernel says its uid is ours (SO_PEERCRED), else refused with
a log line. Each client gets two threads: a reader (its lines become commands, or an
`error` event to that client alone) and a writer (its own bounded queue on the event bus,
plus status frames when the status bar's facts change). A stalled client fills its own
queue, whose oldest events are dropped and counted: the training thread only ever appends.

The engine side of the protocol: it reads the live Session, so it is not torch-free;
the framing it speaks is workbench/protocol/wire.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.protocol.events import CommandError, Error, Memory, Step, parse_command
from workbench.protocol.wire import (
    ClientHello,
    Peer,
    WireError,
    parse_client_hello,
    parse_json_line,
    peer_of,
    wire_line,
)
from workbench.protocol.lines import read_lines

if TYPE_CHECKING:
    from workbench.engine.session import Session

CLIENT_QUEUE = 20_000  # events a client may fall behind by before the oldest are dropped
LOG_REPLAY = 1_000  # log events replayed to a client that attaches late
COALESCE = 0.01  # events that arrive together are sent together
# A client's writer wakes at once for anything but routine telemetry (a command, a reload, a pause, an error), and
# otherwise this often: steps and memory samples leave in batches, with the status's counters. One wakeup per step
# would cost the training thread the GIL and a core at every step, in this process and in the client's.
FLUSH_EVERY = 0.25
# Status fields that move with every step: sent at most this often (a state change goes out at its next wakeup).
COUNTERS = frozenset({"step", "steps_per_second", "setup_elapsed", "unsaved_steps", "last_step_ms"})
COUNTER_EVERY = 0.25
VERSIONS_EVERY = 1.0


_SERVING: list[SessionServer] = []  # the servers of this process, for the fork hook below


def _close_in_forked_child() -> None:
    """A DataLoader worker forked from the session must not hold the session's sockets: if it did, a client would
    not see the session die (the connection stays open in the worker), and the dead session's socket would still
    accept connections. The fds are closed in the child only; nothing else about the server is touched there."""
    for server in _SERVING:
        server._drop_fds_in_child()


os.register_at_fork(after_in_child=_close_in_forked_child)


def close_connections_to(path: str) -> int:
    """Close every Unix socket of this process whose own address is `path`: the listener bound there and each
    connection accepted on it. For a forked child only (the parent's socket objects still name these fds). Linux
    (/proc/self/fd); elsewhere nothing is closed. Returns how many were closed."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    closed = 0
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            probe = socket.socket(fileno=fd)
        except (OSError, ValueError):  # the listing's own fd (gone already), or a socket Python cannot wrap
            continue
        try:
            mine = probe.family == socket.AF_UNIX and probe.getsockname() == path
        except OSError:
            mine = False
        finally:
            probe.detach()  # the probe never closes: only a socket of ours is closed, below
        if mine:
            try:
                os.close(fd)
                closed += 1
            except OSError:
                pass
    return closed


class SessionServer:
    """Serves one Session on `path` until `close()`."""

    def __init__(
        self,
        session: Session,
        path: Path,
        *,
        facts: dict[str, Any],
        peer_credentials: Callable[[socket.socket], Peer] = peer_of,
        client_queue: int = CLIENT_QUEUE,
    ) -> None:
        self.session = session
        self.path = path
        self.facts = facts
        self._peer_credentials = peer_credentials
        self.client_queue = client_queue
        self._recent = session.bus.subscribe(maxlen=LOG_REPLAY, accept=lambda e: not isinstance(e, (Step, Memory)))
        self._clients: dict[int, _Client] = {}
        self._lock = threading.Lock()
        self._next_id = 1
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread = threading.Thread(target=self._accept_loop, name="vram-bench-socket", daemon=True)

    # Lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where another user could connect
        try:
            self._listener.bind(os.fspath(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        self._listener.listen(16)
        _SERVING.append(self)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, end every client (after sending what is queued) and remove the socket."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self in _SERVING:
            _SERVING.remove(self)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(2.0)
        for client in self.clients():
            client.close(flush=True)
        for client in self.clients():
            client.join(2.0)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._recent.close()

    def flush(self, timeout: float) -> None:
        """Wait (at most `timeout` s) until every client has been sent what was published so far: before a
        forced exit, so `stop` and the apps see the `exit` event instead of a socket that just closed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(c.pending() for c in self.clients()):
            time.sleep(0.01)

    def _drop_fds_in_child(self) -> None:
        """In a forked child (no threads there): close our copies of the listening and client sockets, nothing more.
        Then any other connection to our socket: one the accept thread had accepted but not yet listed when the parent
        forked is in no list here, and would keep that client's connection open after the session died."""
        for sock in (self._listener, *(c.conn for c in self._clients.values())):
            try:
                os.close(sock.detach())
            except OSError:
                pass
        close_connections_to(os.fspath(self.path))

    def clients(self) -> list[_Client]:
        with self._lock:
            return list(self._clients.values())

    @property
    def client_count(self) -> int:
        with self._lock:
            return sum(1 for c in self._clients.values() if c.hello is not None)

    # Accepting ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.05)  # EMFILE and friends: do not spin
                continue
            try:
                peer = self._peer_credentials(conn)
            except OSError as exc:
                conn.close()
                self.session.bus.publish(Error(where="client", message=f"a connection was refused: its credentials could not be read ({exc})"))
                continue
            if peer.uid != os.getuid():
                conn.close()
                self.session.bus.publish(Error(where="client", message=f"refused a connection from uid {peer.uid} (pid {peer.pid}): "
                                               f"only uid {os.getuid()}, who runs this session, may attach"))
                continue
            with self._lock:
                client = _Client(self, self._next_id, conn, peer)
                self._clients[client.id] = client
                self._next_id += 1
            client.start()

    def _forget(self, client: _Client) -> None:
        with self._lock:
            self._clients.pop(client.id, None)

    # What a client is sent ---------------------------------------------------------------
    def hello_for(self, client: _Client, hello: ClientHello) -> tuple[str, set[int], int]:
        """The hello line, the log events it replays (by identity, so the live stream skips them)
        and the last step it covers (live steps up to it are skipped too)."""
        session = self.session
        recent = self._recent.recent()
        status = self.status_fields()
        history = None
        last_step = -1
        if hello.history != "none":
            from workbench.protocol.history import build_history

            history = build_history(session.telemetry, max_points=hello.max_points, full=hello.history == "full",
                                    memory_seconds=session.config.memory_window)
            last_step = int(history.get("step", -1))  # live steps up to the replay's last are already in it
        profile = session.last_profile
        line = wire_line(
            "hello",
            protocol=1,
            client_id=client.id,
            session=self.facts,
            status=status,
            history=history,
            log=[e.to_dict() for e in recent],
            last_profile=profile.to_dict() if profile is not None else None,
        )
        return line, {id(e) for e in recent}, last_step

    def status_fields(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self.session.status())
        fields["clients"] = self.client_count
        return fields

    def versions_line(self) -> str:
        from workbench.protocol.events import _jsonable

        return wire_line("versions", rows=_jsonable(self.session.telemetry.versions.rows()))

    def history_line(self, max_points: int, full: bool) -> str:
        from workbench.protocol.history import build_history

        history = build_history(self.session.telemetry, max_points=max_points, full=full,
                                memory_seconds=self.session.config.memory_window)
        return wire_line("history", history=history)

    def command_from(self, client: _Client, text: str) -> None:
        """A command line from a client: sent to the session, and said in every client's log."""
        try:
            command = parse_command(text)
        except CommandError as exc:
            client.say_error(str(exc))
            return
        from workbench.protocol.events import CommandSent

        self.session.bus.publish(CommandSent(client=client.label, command=text.strip()[:200]))
        self.session.send(command)


class _Client:
    """One attached front end: a reader thread and a writer thread over one connection."""

    def __init__(self, server: SessionServer, client_id: int, conn: socket.socket, peer: Peer) -> None:
        self.server = server
        self.id = client_id
        self.conn = conn
        self.peer = peer
        self.hello: ClientHello | None = None
        self.label = f"client {client_id} (pid {peer.pid})"
        self._direct: deque[str] = deque()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._sending = False
        self._subscription = None
        self._skip_ids: set[int] = set()
        self._skip_steps_to = -1
        self._reader = threading.Thread(target=self._read, name=f"vram-bench-client-{client_id}-in", daemon=True)
        self._writer = threading.Thread(target=self._serve_writes, name=f"vram-bench-client-{client_id}-out", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)
        self._writer.join(timeout)

    def close(self, flush: bool = False) -> None:
        self._closed.set()
        self._wake.set()
        if not flush:
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def pending(self) -> bool:
        """Something published or queued for this client has not been written to its socket yet."""
        if self._closed.is_set() and not self._writer.is_alive():
            return False
        sub = self._subscription
        return self._sending or bool(self._direct) or (sub is not None and bool(sub.recent()))

    def send_line(self, line: str) -> None:
        self._direct.append(line)
        self._wake.set()

    def say_error(self, message: str) -> None:
        """An error meant for this client only: the session and the other clients are not bothered."""
        self.send_line(Error(where="command", message=message).to_json())

    # Reader ------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            for line in read_lines(self.conn.fileno(), unterminated_last=False):
                if self._closed.is_set():
                    break
                if line.problem is not None:
                    self.say_error(line.problem)
                    continue
                text = line.text.strip()
                if not text:
                    continue
                try:
                    self._take(text)
                except Exception as exc:  # noqa: BLE001 - a client's line never harms the session
                    self.say_error(f"the line could not be used: {type(exc).__name__}: {exc}")
        finally:
            self.close()

    def _take(self, text: str) -> None:
        if text.startswith("{"):
            try:
                data = parse_json_line(text)
                self._wire_request(data)
            except WireError as exc:
                self.say_error(str(exc))
            return
        if self.hello is None:
            self.say_error("say hello first: {\"wire\": \"hello\", \"protocol\": 1, \"client\": \"NAME\"}")
            return
        self.server.command_from(self, text)

    def _wire_request(self, data: dict[str, Any]) -> None:
        kind = data.get("wire")
        if kind == "hello":
            if self.hello is not None:
                raise WireError("hello was already said")
            hello = parse_client_hello(data)
            self.label = f"client {self.id} ({hello.client}, pid {self.peer.pid})"
            self.hello = hello  # counted in the status its own hello carries
            subscription = self.server.session.bus.subscribe(maxlen=self.server.client_queue, notify=self._wake)  # before the replay
            line, self._skip_ids, self._skip_steps_to = self.server.hello_for(self, hello)
            self._subscription = subscription
            self._direct.appendleft(line)
            self._wake.set()
        elif kind == "history":
            if self.hello is None:
                raise WireError("say hello first")
            self.send_line(self.server.history_line(int(data.get("max_points", self.hello.max_points)), bool(data.get("full"))))
        elif kind == "versions":
            self.send_line(self.server.versions_line())
        else:
            raise WireError(f"unknown request {kind!r}; known: hello, history, versions")

    # Writer ------------------------------------------------------------------------------
    def _write(self) -> None:
        last_status: dict[str, Any] | None = None
        last_status_sent = last_versions = 0.0
        last_updates = last_step = -1
        dropped_told = 0
        while True:
            self._sending = True  # from the drain to the write: `pending()` must not see an empty queue meanwhile
            closing = self._closed.is_set()
            lines: list[str] = []
            while self._direct:
                lines.append(self._direct.popleft())
            sub = self._subscription
            if sub is not None:
                for event in sub.drain():
                    if id(event) in self._skip_ids or (isinstance(event, Step) and event.step <= self._skip_steps_to):
                        continue
                    lines.append(event.to_json())
                self._skip_ids = set()  # only the first drain can overlap the replay (and ids are reused later)
                if sub.dropped > dropped_told:
                    lines.append(wire_line("dropped", count=sub.dropped - dropped_told))
                    dropped_told = sub.dropped
                now = time.monotonic()
                status = self.server.status_fields()
                salient = {k: v for k, v in status.items() if k not in COUNTERS}
                counted = status["step"] != last_step
                if (salient != last_status or now - last_status_sent >= 1.0
                        or (counted and now - last_status_sent >= 0.9 * COUNTER_EVERY)):
                    lines.append(wire_line("status", **status))
                    last_status, last_status_sent, last_step = salient, now, status["step"]
                updates = self.server.session.telemetry.updates
                if updates != last_updates and now - last_versions >= VERSIONS_EVERY:
                    lines.append(self.server.versions_line())
                    last_updates, last_versions = updates, now
            if lines:
                self.conn.sendall(("\n".join(lines) + "\n").encode("utf-8"))
            self._sending = False
            if closing:
                return
            self._wake.wait(FLUSH_EVERY)  # set by a direct line, a close, or any event but routine telemetry
            self._wake.clear()
            time.sleep(COALESCE)  # a burst of events leaves in one write: fewer wakeups and syscalls next to training

    def _serve_writes(self) -> None:
        try:
            self._write()
        except OSError:
            pass  # the client went away: its reader sees the end too
        except Exception as exc:  # noqa: BLE001 - a bug here ends this client, never the session
            self.server.session.bus.publish(Error(where="client", message=f"{self.label} was disconnected: {type(exc).__name__}: {exc}"))
        finally:
            self._closed.set()
            if self._subscription is not None:
                self._subscription.close()
            self._shutdown()
            self._reader.join(5.0)
            try:
                self.conn.close()
            except OSError:
                pass
            self.server._forget(self)
