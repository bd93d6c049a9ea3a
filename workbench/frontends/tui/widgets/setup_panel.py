"""Shown in the chart's place while `setup()` runs (it can take minutes) or after it failed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from workbench.protocol.source import SessionSource as Session
from workbench.frontends.tui.roles import roles


class SetupPanel(Static):
    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._session = session

    def on_mount(self) -> None:
        self._interval = 0.25
        self._timer = self.set_interval(self._interval, self.redraw)
        self.redraw()

    def redraw(self) -> None:
        s = self._session.status()
        showing = s.state in ("setup", "setup failed")
        if self.parent is not None:
            self.parent.set_class(showing, "-setup")
        # Setup comes back only after it failed and a fix is saved: while hidden, look once a second.
        interval = 0.25 if showing else 1.0
        if interval != self._interval:
            self._timer.stop()
            self._timer, self._interval = self.set_interval(interval, self.redraw), interval
        if not showing:
            return
        text = Text()
        palette = roles(self.app)
        if s.state == "setup":
            text.append("Running setup()", style=palette.bold("info"))
            text.append(f"  {s.setup_elapsed:.1f} s\n\n")
            text.append("Loading the model happens once; after that, saves swap code in place.\n", style="dim")
            text.append("What setup() prints appears in the log below.", style="dim")
        else:
            text.append("setup() failed\n\n", style=palette.bold("error"))
            text.append(f"{s.setup_error}\n\n", style=palette.error)
            text.append("The traceback is in the log below. Fix the code and save: setup() runs again.\n")
            text.append("Or press q to quit.", style="dim")
        self.update(text)
