"""A chart update draws its canvases before the frame, with one refresh each: one screen update, not two.

The plot (textual-plot) draws inside the next frame by default, and every line, tick and label it draws refreshes
its canvas, which asks for another frame straight after: on 2 cores shared with training, the attached app's
second-largest cost (bench/RESULTS.md, issue 16)."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widget import Widget

from workbench.frontends.tui.format import short_number
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


async def test_the_plot_is_drawn_again_when_a_bucket_finishes_and_catches_up_when_steps_stop(monkeypatch) -> None:
    """Training: steps inside a bucket that is still filling update the rows, not the plot; a finished bucket
    draws it; once steps stop (paused), one more drawing brings in the latest point, then nothing."""
    from workbench.frontends.tui.widgets import loss_chart

    telemetry = TelemetryMirror()
    telemetry.apply_all(Step(step=n, loss=2.0 / n, ms=1.0) for n in range(1, 5_001))
    app = ChartOnly(telemetry)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        chart = app.query_one(LossChart)
        drawn: list[int] = []
        original = loss_chart._Plot.draw_now
        monkeypatch.setattr(loss_chart._Plot, "draw_now", lambda self: (drawn.append(telemetry.step), original(self))[1])
        rows = app.query_one("#series-rows")

        def beat(last: int) -> None:
            telemetry.apply_all(Step(step=n, loss=1.0 / n, ms=1.0) for n in range(telemetry.step + 1, last + 1))
            chart.redraw()

        beat(5_003)  # the bucket of steps 4992-5023 (stride 32 for 200 points) is still filling
        assert drawn == []
        assert short_number(1.0 / 5_003) in str(rows.render())  # the rows have step 5003's loss
        beat(5_010)
        assert drawn == [] and short_number(1.0 / 5_010) in str(rows.render())
        beat(5_030)  # 5024 finished it
        assert drawn == [5_030]
        beat(5_035)
        assert drawn == [5_030]
        chart.redraw()  # paused: nothing new since the last beat, so the plot catches up to step 5035
        assert drawn == [5_030, 5_035]
        chart.redraw()
        chart.redraw()
        assert drawn == [5_030, 5_035]
        await pilot.pause()


async def test_non_finite_values_are_drawn_as_gaps_in_the_plot_and_marks_in_the_sparklines() -> None:
    """A NaN on one rank (DDP then averages NaN gradients everywhere) reaches the chart as a NaN loss and NaN scalars:
    the app once died on it (`int(nan)` in a sparkline) while the session trained on."""
    telemetry = TelemetryMirror()
    telemetry.apply_all(Step(step=n, loss=2.0 / n, ms=1.0, scalars={"grad_norm": 1.0 + n % 3, "lr": 0.1})
                        for n in range(1, 60))
    app = ChartOnly(telemetry)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        telemetry.apply_all([Step(step=60, loss=float("nan"), ms=1.0, scalars={"grad_norm": float("nan"), "lr": 0.1}),
                             Step(step=61, loss=float("inf"), ms=1.0, scalars={"grad_norm": float("-inf"), "lr": 0.1})])
        chart = app.query_one(LossChart)
        chart.redraw()
        await pilot.pause()
        rows = str(app.query_one("#series-rows").render())
        assert "grad_norm" in rows and rows.count("×") == 2, rows  # the NaN and the -inf, marked
    assert app.return_code in (None, 0), "the chart's redraw raised"


def test_a_sparkline_marks_non_finite_values_and_scales_the_rest() -> None:
    from workbench.frontends.tui.widgets.loss_chart import NON_FINITE_MARK, sparkline

    line = sparkline((1.0, 2.0, float("nan"), 3.0, float("inf")), 10)
    assert len(line) == 5
    assert line[2] == line[4] == NON_FINITE_MARK
    assert line[0] < line[1] < line[3]  # the finite values keep their scale (block characters sort by height)
    assert sparkline((float("nan"),), 10) == NON_FINITE_MARK
