"""Key o: the last profile's top operators, by self CPU (and CUDA) time and by memory."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from workbench.protocol.events import Profile
from workbench.units import human_bytes


class ProfileScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,o", "dismiss", "Close")]

    def __init__(self, profile: Profile | None) -> None:
        super().__init__()
        self._profile = profile

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="report-body") as body:
            body.border_title = "Last profile  (esc close)"
            yield Static(id="profile")

    def on_mount(self) -> None:
        self.query_one("#profile", Static).update(self._report())

    def _report(self) -> RenderableType:
        p = self._profile
        if p is None or p.trace is None:
            return Text("No profile yet: press p while training runs (it records the next 3 steps after 1 warm-up step).")
        cuda = any("self_cuda_ms" in op for op in p.top_ops)
        table = Table(box=None, padding=(0, 1), title=f"{p.steps} steps -> {p.trace} (open it in ui.perfetto.dev)",
                      title_justify="left", title_style="dim")
        for column in ("operator", "calls", "self CPU ms", *(["self CUDA ms"] if cuda else []), "CPU memory"):
            table.add_column(column, justify="left" if column == "operator" else "right")
        for op in p.top_ops:
            table.add_row(
                op["name"],
                str(op["calls"]),
                f"{op['self_cpu_ms']:.2f}",
                *([f"{op.get('self_cuda_ms', 0):.2f}"] if cuda else []),
                human_bytes(op["cpu_memory_bytes"]),
            )
        return table
