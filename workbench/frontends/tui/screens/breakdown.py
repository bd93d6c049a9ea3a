"""Key b: where the session's memory goes, per device, with one-line advice."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from workbench.protocol.events import BreakdownReady, Event, ShowBreakdown
from workbench.protocol.source import SessionSource as Session
from workbench.frontends.tui.format import bar, human_bytes
from workbench.frontends.tui.screens.report import EngineReportScreen


class BreakdownScreen(EngineReportScreen):
    TITLE = "Memory breakdown"

    def __init__(self, session: Session) -> None:
        super().__init__(session, ShowBreakdown(), BreakdownReady)

    def render_report(self, event: Event) -> RenderableType:
        assert isinstance(event, BreakdownReady)
        if not event.devices:
            return Text("The state holds no modules or optimizers to break down.", style="dim")
        parts: list[RenderableType] = [Text(f"at step {event.step}", style="dim")]
        for device in event.devices:
            known = [p["bytes"] for p in device["parts"] if p["bytes"] is not None]
            total = sum(known) or 1
            table = Table(title=f"{device['device']}", title_justify="left", box=None, padding=(0, 1))
            table.add_column("part", style="bold")
            table.add_column("size", justify="right")
            table.add_column("")
            table.add_column("detail", style="dim", overflow="fold")
            for part in device["parts"]:
                size = part["bytes"]
                table.add_row(
                    part.get("label") or part["name"],
                    human_bytes(size) if size is not None else "n/a",
                    bar(size / total, 16) if size is not None else "",
                    part["detail"],
                )
            parts.append(table)
            if device.get("frozen_parameter_bytes"):
                parts.append(Text(f"  frozen parameters: {human_bytes(device['frozen_parameter_bytes'])}", style="dim"))
            for advice in device["advice"]:
                parts.append(Text(f"  > {advice}", style="yellow"))
        return Group(*parts)
