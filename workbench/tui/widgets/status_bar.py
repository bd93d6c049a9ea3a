"""The one-line status bar: project, device, step, speed, state, code version."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from workbench.session import Session

_STATE_STYLE = {
    "running": "bold green",
    "paused": "bold yellow",
    "setup": "bold cyan",
    "setup failed": "bold red",
    "stopped": "bold red",
}


class StatusBar(Static):
    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._session = session

    def on_mount(self) -> None:
        self.refresh_status()
        self.set_interval(0.25, self.refresh_status)

    def refresh_status(self) -> None:
        s = self._session.status()
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
        text.append(state, style=_STATE_STYLE.get(s.state, "bold"))
        if s.profiling:
            text.append(" PROFILING", style="bold magenta")
        if s.activity:
            text.append(f" {s.activity.upper()}...", style="bold blue")
        text.append(f" | code v{s.code_version}")
        if s.needs_rebuild:
            text.append(f" | REBUILD NEEDED ({', '.join(s.needs_rebuild)}): R", style="bold red")
        self.update(text)
