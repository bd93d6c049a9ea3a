"""Key v: one row per code version, with its figures and the change against the previous one."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from workbench.protocol.source import SessionSource as Session
from workbench.units import human_bytes


class VersionsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,v", "dismiss", "Close"),
        Binding("c", "export('csv')", "Export CSV"),
        Binding("j", "export('json')", "Export JSON"),
    ]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self._session = session

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="report-body") as body:
            body.border_title = "Code versions  (c export CSV, j export JSON, esc close)"
            yield Static(id="versions")
            yield Static(id="exported")

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)

    def redraw(self) -> None:
        table = Table(box=None, padding=(0, 1))
        columns = ("v", "changed", "steps", "ms/step", "steps/s", "saved/step", "peak GPU", "peak RSS", "loss", "logged", "vs previous")
        for column in columns:
            table.add_column(column, justify="left" if column in ("changed", "logged", "vs previous") else "right")
        for row in self._session.telemetry.versions.rows():
            table.add_row(
                str(row["version"]),
                ", ".join(row["changed"]) or "(start)",
                str(row["steps"]),
                _num(row["median_step_ms"], "{:.1f}"),
                _num(row["steps_per_second"], "{:.1f}"),
                human_bytes(row["saved_bytes_per_step"]) if row["saved_bytes_per_step"] is not None else "n/a",
                human_bytes(row["peak_allocated"]) if row["peak_allocated"] is not None else "n/a",
                human_bytes(row["peak_rss"]) if row["peak_rss"] is not None else "n/a",
                _num(row["mean_loss"], "{:.4f}"),
                ", ".join(f"{k} {v:.4g}" for k, v in list(row["scalars"].items())[:3]),
                Text(row["delta"], style="yellow"),
            )
        self.query_one("#versions", Static).update(table)

    def action_export(self, fmt: str) -> None:
        path = self._session.telemetry.versions.export(self._session.run_dir, fmt)
        self.query_one("#exported", Static).update(Text(f"\nwritten to {path}", style="green"))


def _num(value: float | None, fmt: str) -> str:
    return fmt.format(value) if value is not None else "n/a"
