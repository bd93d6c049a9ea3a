"""The one-line status bar: project, device, step, speed, state, code version."""

from __future__ import annotations

import time

from rich.text import Text
from textual.timer import Timer
from textual.widgets import Static

from workbench.protocol.source import SessionSource as Session
from workbench.frontends.tui.pane_clock import on_beat
from workbench.frontends.tui.roles import roles
from workbench.frontends.tui.shown_text import ShownText

_STATE_ROLE = {"running": "ok", "paused": "warning", "setup": "info", "setup failed": "error", "stopped": "error"}


FOLLOW_SECONDS = 2.0  # after a key, how long the bar watches closely for the worker to act on it
FOLLOW_INTERVAL = 0.02


class StatusBar(Static):
    """Redraws at 2 Hz (on the panes' beat); right after a key it also shows at once that the key was taken ("PAUSING...")
    and redraws every 20 ms until the worker has acted on it, so a keypress reaches the screen fast."""

    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._session = session
        self._pending: str | None = None
        self._follow_until = 0.0
        self._follow_timer: Timer | None = None
        self._followed: tuple[object, ...] = ()
        self._shown = ShownText()

    def on_mount(self) -> None:
        self.refresh_status()
        on_beat(self, 0.5, self.refresh_status)

    def follow(self, pending: str | None = None) -> None:
        """A command was just sent: show `pending` until the state moves, watching closely meanwhile."""
        self._pending = pending
        self._followed = self._signature()
        self._follow_until = time.monotonic() + FOLLOW_SECONDS
        if self._follow_timer is None:
            self._follow_timer = self.set_interval(FOLLOW_INTERVAL, self._follow_tick)
        self.refresh_status()

    def _signature(self) -> tuple[object, ...]:
        s = self._session.status()
        return (s.state, s.pause_reason, s.activity, s.profiling, s.code_version, tuple(s.needs_rebuild))

    def _follow_tick(self) -> None:
        if self._signature() != self._followed or time.monotonic() > self._follow_until:
            self._pending = None
            if self._follow_timer is not None:
                self._follow_timer.stop()
                self._follow_timer = None
        self.refresh_status()

    def refresh_status(self) -> None:
        s = self._session.status()
        palette = roles(self.app)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" vram-bench ", style="bold reverse")
        text.append(f" {s.project} ", style="bold")
        text.append(f"| {s.device} ")
        text.append(f"| step {s.step} ")
        if s.state == "running":
            text.append(f"| {s.steps_per_second:.1f} steps/s ")
        state = s.state.upper()
        if s.state == "paused" and s.pause_reason:
            state += f" ({s.pause_reason})"
        if s.state == "setup":
            state += f" {s.setup_elapsed:.0f}s"
        text.append("| ")
        text.append(state, style=palette.bold(_STATE_ROLE[s.state]) if s.state in _STATE_ROLE else "bold")
        if s.held:  # under torchrun: "running" at 0 steps/s would not say that rank 0 waits for another rank
            text.append(f" WAITING for {s.held}", style=palette.bold("warning"))
        if self._pending:
            text.append(f" {self._pending}", style=palette.bold("info"))
        if s.profiling:
            text.append(" PROFILING", style=palette.bold("accent"))
        if s.activity:
            text.append(f" {s.activity.upper()}...", style=palette.bold("info"))
        text.append(f" | code v{s.code_version}")
        if s.clients > 1:  # this app is one of them: say when others watch (and may send commands) too
            text.append(f" | {s.clients} attached", style=palette.bold("info"))
        if s.needs_rebuild:
            text.append(f" | REBUILD NEEDED ({', '.join(s.needs_rebuild)}): {self.app.key_for('rebuild')}", style=palette.bold("error"))
        if s.memory_warning:
            text.append(f" | {s.memory_warning.upper()}", style=palette.bold("warning"))
        self._shown.show(self, text)
