"""Asked before quitting with unsaved progress: snapshot first, quit anyway, or stay."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmQuitScreen(ModalScreen[str | None]):
    """Dismisses with "snapshot", "quit", or None (stay)."""

    BINDINGS = [
        Binding("s", "choose('snapshot')", "Snapshot and quit"),
        Binding("y,q", "choose('quit')", "Quit without snapshot"),
        Binding("escape,n", "choose(None)", "Stay"),
    ]

    def __init__(self, unsaved_steps: int) -> None:
        super().__init__()
        self._unsaved = unsaved_steps

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-box") as box:
            box.border_title = "Quit vram-bench?"
            yield Static(
                Text.assemble(
                    (f"{self._unsaved} steps were trained since the last snapshot.\n\n", "bold"),
                    ("s", "bold"), "  snapshot, then quit (resume later with --resume latest)\n",
                    ("q", "bold"), "  quit without a snapshot\n",
                    ("esc", "bold"), "  stay",
                )
            )

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
