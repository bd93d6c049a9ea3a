"""Asked on q: leave the session training (detach), stop it (with or without a final snapshot), or stay."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmQuitScreen(ModalScreen[str | None]):
    """Dismisses with "detach", "snapshot" (stop after a final snapshot), "quit" (stop now), or None (stay)."""

    BINDINGS = [
        Binding("d,q", "choose('detach')", "Detach"),
        Binding("s", "choose('snapshot')", "Snapshot and stop"),
        Binding("x", "choose('quit')", "Stop without snapshot"),
        Binding("escape,n", "choose(None)", "Stay"),
    ]

    def __init__(self, unsaved_steps: int, name: str = "") -> None:
        super().__init__()
        self._unsaved = unsaved_steps
        self._session_name = name

    def compose(self) -> ComposeResult:
        attach = f"vram-bench attach {self._session_name}".rstrip()
        if self._unsaved <= 0:
            unsaved = "Nothing was trained since the last snapshot.\n\n"
        else:
            unsaved = f"{self._unsaved} step{' was' if self._unsaved == 1 else 's were'} trained since the last snapshot.\n\n"
        with Vertical(id="quit-box") as box:
            box.border_title = "Leave the session?"
            yield Static(
                Text.assemble(
                    (unsaved, "bold"),
                    ("d", "bold"), f"  detach: training goes on; come back with {attach}\n",
                    ("s", "bold"), "  stop the session after a final snapshot (resume later with --resume latest)\n",
                    ("x", "bold"), "  stop the session without a snapshot\n",
                    ("esc", "bold"), "  stay",
                )
            )

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
