"""Help: every key, and what each pane shows, drawn over the main screen.

Why a widget in a layer of its own and not a Screen: measured in the real app
while training on 2 cores, a help screen composed on each open took 150-400 ms
to appear, and even one built once and pushed again took a median of 160 ms;
this panel, which already exists and only changes `display`, appears in about
50 ms. It is docked so that showing it never changes the screen's size: the
panes below keep their sizes and rendered lines.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, VerticalScroll
from textual.events import DescendantBlur
from textual.widget import Widget
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

MAX_WIDTH = 110  # the help body's widest, border included; also in app.tcss


def help_width(screen_width: int) -> int:
    """Text width inside the help body: 90% of the screen, at most MAX_WIDTH, less border and padding."""
    return min(MAX_WIDTH, int(screen_width * 0.9)) - 6


def keys_table(keys: list[tuple[str, str]], width: int) -> Text:
    table = Table(title="Keys", show_header=False, box=None, padding=(0, 2))
    for key, what in keys:
        table.add_row(Text(key, style="bold"), what)
    return as_text(table, width)


def panes_table(width: int) -> Text:
    table = Table(title="Panes", show_header=False, box=None, padding=(0, 2))
    for name, what in PANES:
        table.add_row(Text(name, style="bold"), what)
    return as_text(table, width)


def closing_words() -> Text:
    return Text(
        "Save any .py file in the project folder: changed functions and methods are swapped in place "
        f"at the next step boundary; the model and optimizer stay. Themes and key bindings: {config_dir()}/"
        "config.toml (see the README). Esc closes this help.",
        style="dim",
    )


class HelpPanel(Container):
    """Hidden until `show`; escape or q hides it, and so does moving the focus elsewhere (tab).

    Escape is bound here, hidden; q stays the app's (its quit action closes the help first). So
    the footer shows the same keys with the help open, and does not have to be rebuilt.
    """

    BINDINGS = [Binding("escape", "close", "Close help", show=False)]

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self._drawn_for: tuple[tuple[tuple[str, str], ...], int] | None = None
        self._return_focus: Widget | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(id="help-keys")
            yield Static(id="help-panes")
            yield Static(id="help-words")

    @property
    def shown(self) -> bool:
        return self.display

    def show(self, keys: list[tuple[str, str]]) -> None:
        """Draw the keys in effect (only when they or the width changed), then show and focus the help."""
        width = help_width(self.app.size.width)
        wanted = (tuple(keys), width)
        if wanted != self._drawn_for:
            self._drawn_for = wanted
            self.query_one("#help-keys", Static).update(keys_table(keys, width))
            self.query_one("#help-panes", Static).update(panes_table(width))
            self.query_one("#help-words", Static).update(closing_words())
        focused = self.screen.focused
        self._return_focus = None if focused is None or self in focused.ancestors_with_self else focused
        self.display = True
        body = self.query_one("#help-body", VerticalScroll)
        body.scroll_home(animate=False)
        body.focus()

    def hide(self, *, restore_focus: bool = True) -> None:
        if not self.display:
            return
        self.display = False
        returning, self._return_focus = self._return_focus, None
        if restore_focus and returning is not None and returning.is_attached:
            returning.focus()

    def action_close(self) -> None:
        self.hide()

    def on_descendant_blur(self, event: DescendantBlur) -> None:
        """Tab moved the focus under the help: hide it and leave the focus where it went."""
        focused = self.screen.focused
        if self.display and (focused is None or self not in focused.ancestors_with_self):
            self.hide(restore_focus=False)
