"""The live loss chart, plus a sparkline row for every other scalar series.

Series whose name contains "loss" share the plot (they share a scale); the
rest (lr, grad norm, accuracy...) get a compact row each. Versions of the code
are marked on the chart where they started.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plot import HiResMode, PlotWidget

from workbench.protocol.mirror import Series, TelemetryMirror as Telemetry  # the engine's Telemetry reads the same
from workbench.frontends.tui.format import short_number
from workbench.frontends.tui.pane_clock import on_beat
from workbench.frontends.tui.roles import roles
from workbench.frontends.tui.shown_text import ShownText

_SPARK = "▁▂▃▄▅▆▇█"


class _Plot(PlotWidget, can_focus=False):
    """The plot, without pan/zoom keys that would shadow the app's."""

    def draw_now(self) -> None:
        """Draw what was plotted into the canvases now, with one refresh each.

        Left to itself, the plot draws inside the next frame, and every line, tick and label it draws refreshes
        its canvas (about 120 calls a redraw), which asks for a second frame right after the first: a chart
        update cost two compositor passes. Drawn here, before the frame, it costs one."""
        with ExitStack() as batch:
            for canvas in self.query("Canvas"):  # textual-hires-canvas's widget, by its type name
                batch.enter_context(canvas.batch_refresh())  # type: ignore[attr-defined]
            self.render()  # draws when something changed since the last draw, else returns at once


NON_FINITE_MARK = "×"  # a NaN or infinite value in a sparkline (a NaN on one rank reaches every rank's gradients)


def sparkline(values: tuple[float, ...], width: int) -> str:
    """The last `width` values as block characters, scaled to the finite ones; a non-finite value is a mark."""
    if not values or width <= 0:
        return ""
    values = values[-width:]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return NON_FINITE_MARK * len(values)
    lo, span, top = min(finite), max(finite) - min(finite), len(_SPARK) - 1

    def bar(v: float) -> str:
        if not math.isfinite(v):
            return NON_FINITE_MARK
        return _SPARK[3] if span <= 0 else _SPARK[min(int((v - lo) / span * top), top)]

    return "".join(map(bar, values))


COMPACT_BELOW_ROWS = 12


class LossChart(Vertical):
    def __init__(self, telemetry: Telemetry, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._telemetry = telemetry
        self._drawn: tuple[object, ...] | None = None  # the picture's steady part when the plot was last drawn
        self._plotted_latest: tuple[object, ...] = ()  # and the latest point of each loss series then
        self._caught_up = False  # the plot shows the latest points too
        self.plotted_points = 0  # points in the plot as last drawn (benchmarks wait for a chart with its history)
        self._rows_shown = ShownText()
        self._seen: tuple[object, ...] = ()
        self._rows_height = ""

    def compose(self) -> ComposeResult:
        yield _Plot(allow_pan_and_zoom=False, id="loss-plot")
        yield Static(id="series-rows")

    def on_mount(self) -> None:
        plot = self.query_one(_Plot)
        plot.set_xlabel("step")
        self.redraw()
        # Once a second: drawing the braille plot is the UI's largest cost, and on a machine where torch
        # already uses every core, each redraw slows training (bench/tui_cost.py measures it).
        on_beat(self, 1.0, self.redraw)

    def on_resize(self) -> None:
        """Switch between plot and sparkline rows as soon as the pane's size changes, not at the next tick."""
        self.redraw()

    def redraw(self) -> None:
        """Once a second: the rows' latest values, and the plot when its picture changed.

        While training, the plot is drawn again only when a bucket of steps finished (`chart_series`: about every
        second early in a run, every few seconds after an hour): redrawing it every second for a line that moved by
        less than a pixel was most of what the attached app cost a CPU-bound run. Its latest points follow with
        each drawing, and once the data stops moving (paused, or between slow steps) the plot catches up to them."""
        seen = (self._telemetry.updates, self.size, self.app.theme)
        settled = seen == self._seen  # nothing new since the last beat
        if settled and self._caught_up:
            return  # paused, and the plot already shows every point
        self._seen = seen
        plot = self.query_one(_Plot)
        width = max(self.size.width, 20)
        series = self._telemetry.chart_series(max_points=2 * width)  # braille: two dots a cell across
        losses = [s for s in series if "loss" in s.name]
        others = [s for s in series if "loss" not in s.name]
        # Too short for a plot with axes (80x24): every series becomes a sparkline row instead.
        compact = 0 < self.size.height < COMPACT_BELOW_ROWS
        plot.display = not compact
        self.set_class(compact, "-compact")
        if compact:
            self._drawn, self._caught_up = None, True  # the plot misses updates while hidden; the rows have them
            self._draw_rows([], losses + others, width, roles(self.app).series[0])
            return
        palette = roles(self.app)
        steady = (tuple((s.name, s.steps[:-1], s.values[:-1]) for s in losses), self._telemetry.version_starts(),
                  self.app.theme, width)
        latest = tuple((s.name, s.steps[-1:]) for s in losses)
        if steady != self._drawn or (settled and latest != self._plotted_latest):
            self._drawn, self._plotted_latest = steady, latest
            self.plotted_points = sum(len(s.steps) for s in losses)
            plot.clear()
            for i, s in enumerate(losses):
                colour = palette.series[i % len(palette.series)]
                plot.plot(s.steps, s.values, line_style=colour, hires_mode=HiResMode.BRAILLE, label=s.name)
            for step, version in self._telemetry.version_starts():
                plot.add_v_line(step, palette.neutral, f"v{version}")
            plot.show_legend(is_visible=len(losses) > 1)
            plot.draw_now()
        self._caught_up = latest == self._plotted_latest
        self._draw_rows(losses, others, width, palette.ok)

    def _draw_rows(self, losses: list[Series], others: list[Series], width: int, spark_style: str) -> None:
        rows = self.query_one("#series-rows", Static)
        text = Text(no_wrap=True, overflow="ellipsis")
        if not losses and not others:
            text.append("waiting for the first step...", style="dim")
        for s in losses:
            text.append(f"{s.name:>12} ", style="bold")
            text.append(f"{short_number(s.values[-1]):>10}\n")
        for s in others:
            text.append(f"{s.name:>12} ", style="bold")
            text.append(f"{short_number(s.values[-1]):>10} ")
            text.append(sparkline(s.values, max(width - 26, 8)) + "\n", style=spark_style)
        text.rstrip()
        height = "1fr" if self.has_class("-compact") else str(max(len(losses) + len(others), 1))
        if height != self._rows_height:
            self._rows_height = height
            rows.styles.height = height
            self._rows_shown.forget()
        self._rows_shown.show(rows, text)
