"""Key t: every live tensor by owner, and the largest unowned ones with what keeps them alive."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from workbench.protocol.events import Event, FindLeaks, LeaksFound
from workbench.protocol.source import SessionSource as Session
from workbench.frontends.tui.format import human_bytes
from workbench.frontends.tui.screens.report import EngineReportScreen


class LeaksScreen(EngineReportScreen):
    TITLE = "Leak finder"

    def __init__(self, session: Session) -> None:
        super().__init__(session, FindLeaks(), LeaksFound)

    def render_report(self, event: Event) -> RenderableType:
        assert isinstance(event, LeaksFound)
        parts: list[RenderableType] = [
            Text(
                f"at step {event.step}: {human_bytes(event.total_bytes)} in live tensors, "
                f"{human_bytes(event.unowned_bytes)} owned by nothing in the state (census took {event.seconds:.2f} s)",
            )
        ]
        if event.suspects:
            parts.append(Text("\nSuspects (largest unowned first)", style="bold underline"))
            for i, suspect in enumerate(event.suspects, 1):
                parts.append(Text(f"{i}. {suspect['count']} x {suspect['description']}: {human_bytes(suspect['bytes'])}", style="bold red" if i == 1 else "bold"))
                chain = " <- ".join(suspect["referrers"]) or "no referrer found (held by C code or a frame)"
                parts.append(Text(f"   kept alive by: {chain}", style="yellow"))
        else:
            parts.append(Text("\nNo unowned tensors: everything alive belongs to the model, the optimizer or the state.", style="green"))
        table = Table(title="\nAll live tensors", title_justify="left", box=None, padding=(0, 1))
        for column in ("owner", "device", "dtype", "shape", "count", "size"):
            table.add_column(column, justify="right" if column in ("count", "size") else "left")
        for group in event.groups:
            table.add_row(
                group["owner"], group["device"], group["dtype"], str(tuple(group["shape"])), str(group["count"]), human_bytes(group["bytes"])
            )
        parts.append(table)
        return Group(*parts)
