"""A session process, as a front end sees it: the app's whole view of the engine, fed by the socket.

`RemoteSession` offers what the Textual app reads (status, a telemetry mirror, an event bus
to subscribe to, `send`) and nothing else: the app never touches engine objects. One reader
thread turns the socket's lines into mirror updates and bus events; a lost link is retried
for a while; a session that died is said so, with its last snapshot and the command to resume.
Stdlib only (no torch, no Textual).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.protocol.eventbus import EventBus, Subscription
from workbench.protocol.events import Command, Error, Event, Exit, Profile, Snapshot, command_line, event_from_dict
from workbench.protocol import registry
from workbench.protocol.client import SessionClient, SessionGone
from workbench.protocol.mirror import TelemetryMirror
from workbench.protocol.status import SessionStatus
from workbench.protocol.wire import ClientHello, WireError

RECONNECT_FOR = 10.0  # seconds a dropped link is retried before the app says it is lost
RESTART_WAIT = 600.0  # seconds to wait for torchrun's restarted rank 0 to serve (setup() may load a model for minutes)


class _ReplayingBus(EventBus):
    """An event bus whose readers made before `start()` (the app's log, composed with the screen) first get
    the log history the session replayed; later ones (a report screen waiting for its answer) get only new events."""

    def __init__(self) -> None:
        super().__init__()
        self.replayed: tuple[Event, ...] = ()
        self.replaying = True

    def subscribe(self, maxlen: int = 50_000, accept: Callable[[Event], bool] | None = None) -> Subscription:
        sub = super().subscribe(maxlen, accept)
        if self.replaying:
            for event in self.replayed:
                sub._offer(event)
        return sub


class RemoteSession:
    """One attached client of a session process."""

    def __init__(self, entry: registry.SessionEntry, *, client: str = "app", max_points: int = 2000,
                 reconnect_for: float = RECONNECT_FOR) -> None:
        self.entry = entry
        self.bus = _ReplayingBus()
        self.telemetry = TelemetryMirror()
        self.facts: dict[str, Any] = {}
        self.last_profile: Profile | None = None
        self.ended: str | None = None  # why the session is gone; None while it runs
        self.exit_code: int | None = None
        self.final_snapshot: Snapshot | None = None  # the one the session wrote on its way out
        self._restarting = False  # a rank was lost and torchrun will start every rank again (--max-restarts)
        self._hello = ClientHello(client=client, history="screen", max_points=max_points)
        self._reconnect_for = reconnect_for
        self._status = SessionStatus.waiting(project=entry.name)
        self._client: SessionClient | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, name="vram-bench-attach", daemon=True)

    # What the app reads ------------------------------------------------------------------------
    def status(self) -> SessionStatus:
        return self._status

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def project_root(self) -> Path:
        return Path(self.facts.get("project", "."))

    @property
    def run_dir(self) -> Path:
        return Path(self.facts.get("run_dir", "."))

    @property
    def memory_window(self) -> float:
        return float(self.facts.get("memory_window", 300.0))

    @property
    def unsaved_steps(self) -> int:
        return self._status.unsaved_steps

    @property
    def resume_command(self) -> str:
        entry = self.facts.get("entry", "train.py")
        return f"vram-bench run {entry} --resume latest"

    # Lifecycle ---------------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect and take the hello (the whole history): before the app draws, so its first frame is complete."""
        self._take_hello(SessionClient(self.entry.socket, self._hello))

    def start(self) -> None:
        """Start reading (the app calls this when mounted)."""
        if self._client is None and self.ended is None:
            self.connect()
        self.bus.replaying = False
        if not self._thread.is_alive():
            self._thread.start()

    def close(self) -> None:
        """Detach: the session goes on."""
        self._closing.set()
        if self._client is not None:
            self._client.close()

    def send(self, command: Command) -> None:
        """Never blocks the UI for long: a line on a local socket; a gone session is said in the log."""
        client = self._client
        if client is None or self.ended is not None:
            self.bus.publish(Error(where="session", message=f"not sent ({command.word}): {self.ended or 'not connected'}"))
            return
        try:
            client.send_line(command_line(command))
        except SessionGone as exc:
            self.bus.publish(Error(where="session", message=f"not sent ({command.word}): {exc}"))

    def request_quit(self, final_snapshot: bool = False, reason: str = "quit") -> None:
        """Stop the session (the app's `stop` choice): its final snapshot first, if asked."""
        from workbench.protocol.events import Quit

        self.send(Quit(final_snapshot=final_snapshot, reason=reason))

    # Reading -----------------------------------------------------------------------------------
    def _take_hello(self, client: SessionClient) -> None:
        hello = client.hello
        self.facts = dict(hello.get("session") or {})
        self._status = SessionStatus.from_wire(hello.get("status") or {})
        if hello.get("history") is not None:
            self.telemetry.load_history(hello["history"])
        if hello.get("last_profile"):
            profile = event_from_dict(hello["last_profile"])
            self.last_profile = profile if isinstance(profile, Profile) else None
        replayed = []
        for data in hello.get("log") or ():
            try:
                replayed.append(event_from_dict(data))
            except ValueError:
                continue  # an event this version does not know
        self.bus.replayed = tuple(replayed)
        self._client = client

    def _read(self) -> None:
        while not self._closing.is_set():
            client = self._client
            if client is not None:
                self._pump(client)
            if self._closing.is_set() or self.ended is not None:
                return
            self._client = None
            if not self._reconnect():
                return

    def _pump(self, client: SessionClient) -> None:
        for message in client.messages():
            kind = message.get("wire")
            try:
                if kind is None:
                    event = event_from_dict(message)
                    self.telemetry.apply(event)
                    if isinstance(event, Profile) and event.status == "done":
                        self.last_profile = event
                    if isinstance(event, Snapshot) and event.reason == "final":
                        self.final_snapshot = event
                    if isinstance(event, Exit):
                        self.exit_code = event.code
                        if event.reason == "rank lost" and self._torchrun_restarts():
                            self._restarting = True
                        else:
                            self.ended = f"the session ended ({event.reason}, exit code {event.code})"
                    self.bus.publish(event)
                elif kind == "status":
                    self._status = SessionStatus.from_wire(message)
                elif kind == "versions":
                    self.telemetry.load_versions(message.get("rows") or ())
                elif kind == "history":
                    self.telemetry.load_history(message["history"])
                elif kind == "dropped":
                    self.bus.publish(Error(where="session", message=f"{message.get('count')} events were dropped: "
                                           "this client fell behind (the session did not wait for it)"))
            except (ValueError, KeyError, TypeError):
                continue  # a message this version cannot read: the rest still can

    def _torchrun_restarts(self) -> bool:
        """torchrun's launcher lives and has restarts left: it starts every rank again after a lost one."""
        job = self.facts.get("torchrun") or {}
        try:
            left = int(job.get("max_restarts", 0)) - int(job.get("restart", 0))
            launcher = int(job.get("launcher_pid", 0))
        except (TypeError, ValueError):
            return False
        return left > 0 and launcher > 0 and registry.pid_alive(launcher)

    def _await_restart(self) -> bool:
        """A rank was lost and torchrun restarts every rank: wait for the new rank 0's socket (a new pid) while the
        launcher lives, then carry on with its hello, as after a dropped link."""
        job = self.facts.get("torchrun") or {}
        launcher, old_pid = int(job.get("launcher_pid", 0)), int(self.facts.get("pid", 0) or 0)
        attempt = int(job.get("restart", 0)) + 1
        self.bus.publish(Error(where="restart", message=(
            f"a rank was lost: torchrun starts every rank again (restart {attempt} of {job.get('max_restarts')}); "
            "this app attaches to the new rank 0 when it serves")))
        deadline = time.monotonic() + RESTART_WAIT
        while not self._closing.is_set():
            if not registry.pid_alive(launcher) or time.monotonic() > deadline:
                gone = "ended" if not registry.pid_alive(launcher) else f"did not serve again within {RESTART_WAIT:.0f} s"
                self.ended = f"the session ended (rank lost; torchrun's restart {gone})"
                self.bus.publish(Error(where="session", message=self.ended))
                return False
            facts = registry.read_facts(self.entry.socket.with_suffix(".json"))
            if facts is None or facts.pid == old_pid or not registry.answers(self.entry.socket, 0.5):
                time.sleep(0.25)
                continue
            try:
                client = SessionClient(self.entry.socket, self._hello, timeout=5.0)
            except (SessionGone, WireError, OSError):
                time.sleep(0.25)
                continue
            self._take_hello(client)
            self._restarting, self.exit_code, self.final_snapshot = False, None, None
            self.bus.publish(Error(where="restart", message=(
                f"attached to the restarted rank 0 (pid {facts.pid}, restart {attempt}); the chart restarts from "
                "the step it resumed at")))
            return True
        return False

    def _reconnect(self) -> bool:
        """The link dropped: retry while the session's process lives; say what happened."""
        if self._restarting:
            return self._await_restart()
        pid = int(self.facts.get("pid", 0) or 0)
        deadline = time.monotonic() + self._reconnect_for
        said = False
        while not self._closing.is_set():
            if pid and not registry.pid_alive(pid):
                self._died()
                return False
            try:
                client = SessionClient(self.entry.socket, self._hello, timeout=2.0)
            except (SessionGone, WireError, OSError):
                if time.monotonic() > deadline:
                    self.ended = f"lost the link to session {self.name} (pid {pid} still runs): vram-bench attach {self.name}"
                    self.bus.publish(Error(where="session", message=self.ended))
                    return False
                if not said:
                    self.bus.publish(Error(where="session", message="the link to the session dropped; reconnecting..."))
                    said = True
                time.sleep(0.5)
                continue
            self._status = SessionStatus.from_wire(client.hello.get("status") or {})
            if client.hello.get("history") is not None:
                self.telemetry.load_history(client.hello["history"])  # the chart gets the steps it missed
            self._client = client
            self.bus.publish(Error(where="session", message="the link to the session dropped and was restored; the chart "
                                   "has the steps trained meanwhile, the log does not"))
            return True
        return False

    def _died(self) -> None:
        snapshot = self._status.last_snapshot
        where = f"its last snapshot: {snapshot}" if snapshot else "it wrote no snapshot"
        self.ended = (f"the session died (pid {self.facts.get('pid')} is gone, killed?); {where}. "
                      f"Resume with: {self.resume_command}")
        self.exit_code = 1
        self._status = SessionStatus.from_wire({**self._status.__dict__, "state": "stopped", "steps_per_second": 0.0})
        self.bus.publish(Error(where="session", message=self.ended))
