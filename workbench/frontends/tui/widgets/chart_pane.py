"""The chart pane: the loss chart, or the setup panel while setup() runs or after it failed.

A focusable frame so tab can reach it and z can maximize it like the other panes.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from workbench.protocol.source import SessionSource as Session
from workbench.frontends.tui.widgets.loss_chart import LossChart
from workbench.frontends.tui.widgets.setup_panel import SetupPanel


class ChartPane(Vertical, can_focus=True):
    ALLOW_MAXIMIZE = True

    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._session = session

    def compose(self) -> ComposeResult:
        yield SetupPanel(self._session, id="setup")
        yield LossChart(self._session.telemetry, id="chart")
