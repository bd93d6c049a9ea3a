"""The one-line status bar: project, device, step, speed, state, code version."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from workbench.session import Session
from workbench.tui.roles import roles

_STATE_ROLE = {"running": "ok", "paused": "warning", "setup": "info", "setup failed": "error", "stopped": "error"}


class StatusBar(Static):
    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._session = session

    def on_mount(self) -> None:
        self.refresh_status()
        self.set_interval(0.25, self.refresh_status)

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
        if s.profiling:
            text.append(" PROFILING", style=palette.bold("accent"))
        if s.activity:
            text.append(f" {s.activity.upper()}...", style=palette.bold("info"))
        text.append(f" | code v{s.code_version}")
        if s.needs_rebuild:
            text.append(f" | REBUILD NEEDED ({', '.join(s.needs_rebuild)}): {self.app.key_for('rebuild')}", style=palette.bold("error"))
        self.update(text)
