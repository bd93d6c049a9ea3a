"""What a front end reads of a session: the one seam between the app and the engine.

Two things satisfy it: `workbench.protocol.remote.RemoteSession` (a session process over its
socket: what `vram-bench run` and `attach` open) and the in-process `workbench.engine.session.Session`
(tests drive the app with one, as they drive the engine). The app uses nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import Command, Profile
from workbench.protocol.status import SessionStatus


class SessionSource(Protocol):
    bus: EventBus  # events, to subscribe to (the log, report screens)
    telemetry: Any  # series, memory history, versions table: Telemetry or TelemetryMirror
    last_profile: Profile | None

    @property
    def project_root(self) -> Path: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def memory_window(self) -> float: ...
    @property
    def unsaved_steps(self) -> int: ...
    @property
    def ended(self) -> str | None: ...  # why the session is gone; None while it runs

    def start(self) -> None: ...
    def status(self) -> SessionStatus: ...
    def send(self, command: Command) -> None: ...
    def request_quit(self, final_snapshot: bool = False, reason: str = "quit") -> None: ...
