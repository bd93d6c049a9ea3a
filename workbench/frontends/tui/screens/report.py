"""A screen that asks the training thread for a report and shows it when it arrives.

The request is a command (computed between steps, never on the UI thread); the
answer is an event, picked from the screen's own subscription on a timer.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from workbench.protocol.events import Command, Error, Event
from workbench.protocol.source import SessionSource as Session


class EngineReportScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("r", "refresh_report", "Refresh"),
    ]
    TITLE = "Report"

    def __init__(self, session: Session, command: Command, answer: type[Event]) -> None:
        super().__init__()
        self._session = session
        self._command = command
        self._answer = answer
        self._events = session.bus.subscribe(maxlen=100, accept=lambda e: isinstance(e, (answer, Error)))

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="report-body") as body:
            body.border_title = f"{self.TITLE}  (r refresh, esc close)"
            yield Static(Text("asking the training thread (it answers between two steps)...", style="dim"), id="report")

    def on_mount(self) -> None:
        self.action_refresh_report()
        self.set_interval(0.25, self._pull)

    def on_unmount(self) -> None:
        self._events.close()

    def action_refresh_report(self) -> None:
        self._session.send(self._command)

    def _pull(self) -> None:
        for event in self._events.drain():
            if isinstance(event, self._answer):
                self.query_one("#report", Static).update(self.render_report(event))
            elif isinstance(event, Error) and event.where in ("command", self._command.word):
                self.query_one("#report", Static).update(Text(event.message, style="red"))

    def render_report(self, event: Event) -> RenderableType:
        raise NotImplementedError
