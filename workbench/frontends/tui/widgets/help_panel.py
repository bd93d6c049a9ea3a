"""Help: every key, and what each pane shows, drawn over the main screen.

Why a widget in a layer of its own and not a Screen: measured in the real app
while training on 2 cores, a help screen composed on each open took 150-400 ms
to appear, and even one built once and pushed again took a median of 160 ms;
this panel, which already exists and only changes `display`, appears in about
50 ms. It is docked so that showing it never changes the screen's size: the
panes below keep their sizes (a resize would re-render the plot, re-wrap the log).

While it is shown, the panes it covers (`covers`) are taken out of the layout
(`display: none`, sizes kept). Textual draws every widget in its map, covered or
not: with the panes in, each of their 2-4 Hz updates was drawn under the help,
and opening the help drew them all again, cut at every pane edge (about 27 ms
of the UI thread, idle; 15 ms without them).
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
from workbench.frontends.tui.prerender import as_text

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
    """Hidden until `show`; escape or q hides it, and so does moving the focus on (tab).

    Escape and tab are bound here, hidden; q stays the app's (its quit action closes the help
    first). So the footer shows the same keys with the help open, and is not rebuilt.
    """

    BINDINGS = [
        Binding("escape", "close", "Close help", id="help_close", show=False),
        Binding("tab", "close_and_move(1)", "Close help, next pane", id="help_next_pane", show=False),
        Binding("shift+tab", "close_and_move(-1)", "Close help, previous pane", id="help_previous_pane", show=False),
    ]

    def __init__(self, *, covers: tuple[str, ...] = (), id: str | None = None) -> None:  # noqa: A002 - Textual's name
        """`covers`: selectors of the widgets on this screen that the help hides while shown."""
        super().__init__(id=id)
        self._covers = covers
        self._drawn_for: tuple[tuple[tuple[str, str], ...], int] | None = None
        self._return_focus: Widget | None = None
        self._taken_out: list[Widget] = []

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
        if self.display:
            return
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
        self._take_out_covered()

    def hide(self, *, restore_focus: bool = True) -> None:
        if not self.display:
            return
        self.display = False
        self._put_back_covered()
        returning, self._return_focus = self._return_focus, None
        if restore_focus and returning is not None and returning.is_attached:
            returning.focus()

    def _take_out_covered(self) -> None:
        """Hide what the help covers; not under a maximized pane (the only one drawn, and Textual
        shows it from wherever it is, so it stays)."""
        if self.screen.maximized is not None:
            return
        self._taken_out = [w for selector in self._covers for w in self.screen.query(selector) if w.display]
        for widget in self._taken_out:
            widget.display = False

    def _put_back_covered(self) -> None:
        """Clear the inline `display` set above, so the stylesheet decides again (narrow layouts)."""
        for widget in self._taken_out:
            if widget.is_attached:
                widget.styles.display = None
        self._taken_out = []

    def action_close(self) -> None:
        self.hide()

    def action_close_and_move(self, direction: int) -> None:
        """Tab closes the help and moves on from the pane that had the focus, as it would have
        without the help (the panes are out of the focus chain while it is shown)."""
        start = self._return_focus
        self.hide(restore_focus=False)
        if start is not None and start.is_attached:
            self.screen.set_focus(start)
        if direction > 0:
            self.screen.focus_next()
        else:
            self.screen.focus_previous()

    def on_descendant_blur(self, event: DescendantBlur) -> None:
        """Something else took the focus (a click, a binding): hide the help, leave the focus there."""
        focused = self.screen.focused
        if self.display and (focused is None or self not in focused.ancestors_with_self):
            self.hide(restore_focus=False)
