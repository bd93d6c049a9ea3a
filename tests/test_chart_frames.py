"""A chart update draws its canvases before the frame, with one refresh each: one screen update, not two.

The plot (textual-plot) draws inside the next frame by default, and every line, tick and label it draws refreshes
its canvas, which asks for another frame straight after: on 2 cores shared with training, the attached app's
second-largest cost (bench/RESULTS.md, issue 16)."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widget import Widget

from workbench.frontends.tui.widgets.loss_chart import LossChart
from workbench.protocol.events import Step
from workbench.protocol.mirror import TelemetryMirror


class ChartOnly(App[None]):
    def __init__(self, telemetry: TelemetryMirror) -> None:
        super().__init__()
        self.telemetry = telemetry

    def compose(self) -> ComposeResult:
        yield LossChart(self.telemetry, id="chart")


async def test_a_redraw_refreshes_each_canvas_once_and_leaves_nothing_to_draw_in_the_frame(monkeypatch) -> None:
    telemetry = TelemetryMirror()
    telemetry.apply_all(Step(step=n, loss=2.0 / n, ms=1.0, scalars={"lr": 0.1}) for n in range(1, 200))
    app = ChartOnly(telemetry)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        chart = app.query_one(LossChart)
        canvases = list(chart.query("Canvas"))
        assert canvases, "textual-plot draws on textual-hires-canvas Canvas widgets"
        refreshes: list[str] = []
        original = Widget.refresh

        def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if type(self).__name__ == "Canvas":
                refreshes.append(str(self.id))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Widget, "refresh", counting)
        telemetry.apply_all(Step(step=n, loss=1.0 / n, ms=1.0, scalars={"lr": 0.1}) for n in range(200, 260))
        chart.redraw()
        drawn_in_redraw = len(refreshes)
        await pilot.pause()  # the frame: the plot must find nothing left to draw
        await pilot.pause()
        assert 1 <= drawn_in_redraw <= len(canvases), refreshes
        assert len(refreshes) == drawn_in_redraw, f"the frame drew the plot again: {refreshes[drawn_in_redraw:]}"
        assert "plot" in refreshes
