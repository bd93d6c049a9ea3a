"""The help screen: every key, and what each pane shows."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from workbench.config import config_dir
from workbench.tui.prerender import as_text

PANES = (
    ("Status bar", "project, device, global step, steps/s, running/paused (and why), code version"),
    ("Loss chart", "every series named *loss*; other scalars that step returns or bench.log()s as rows; "
     "grey lines mark where each code version started"),
    ("Memory", "process RSS (anonymous / file-backed), system RAM; per GPU: other processes + CUDA context, "
     "torch's cached-free blocks, live tensors"),
    ("Log", "reloads (what changed, how fast), errors with tracebacks (your frames first), pauses, snapshots, "
     "cleanup, profiles, and everything your code prints; keeps the last entries (log_entries in the settings file)"),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close help")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self._keys = keys

    def compose(self) -> ComposeResult:
        keys = Table(title="Keys", show_header=False, box=None, padding=(0, 2))
        for key, what in self._keys:
            keys.add_row(Text(key, style="bold"), what)
        panes = Table(title="Panes", show_header=False, box=None, padding=(0, 2))
        for name, what in PANES:
            panes.add_row(Text(name, style="bold"), what)
        # The help body is 90% of the screen, at most 110 columns, less its border and padding.
        width = min(110, int(self.app.size.width * 0.9)) - 6
        with VerticalScroll(id="help-body"):
            yield Static(as_text(keys, width))
            yield Static(as_text(panes, width))
            yield Static(
                Text(
                    "Save any .py file in the project folder: changed functions and methods are swapped in place "
                    f"at the next step boundary; the model and optimizer stay. Themes and key bindings: {config_dir()}/"
                    "config.toml (see the README). Esc closes this help.",
                    style="dim",
                )
            )
