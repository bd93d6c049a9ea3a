"""Asked before an action that cannot be taken back lightly (rebuild): y to go on, n or esc to stay."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (go on) or False (stay)."""

    BINDINGS = [
        Binding("y,enter", "choose(True)", "Yes"),
        Binding("escape,n", "choose(False)", "No"),
    ]

    def __init__(self, title: str, message: str, yes: str) -> None:
        super().__init__()
        self._title, self._message, self._yes = title, message, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="confirm-box") as box:
            box.border_title = self._title
            yield Static(
                Text.assemble(
                    (f"{self._message}\n\n", ""),
                    ("y", "bold"), f"  {self._yes}\n",
                    ("esc", "bold"), "  cancel",
                )
            )

    def action_choose(self, choice: bool) -> None:
        self.dismiss(choice)
