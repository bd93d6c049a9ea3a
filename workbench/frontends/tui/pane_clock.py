"""One clock for every pane's timer, so the redraws due at the same moment reach the terminal as one frame.

Each pane polls its telemetry on its own interval (status 0.5 s, memory 0.5 s, chart 1 s, log
0.25 s). With a Textual timer each, started when its widget mounted, the panes ticked out of step:
while training the screen was composed and written about 7 times a second (the status bar then at
0.25 s). Here one timer per app beats every 0.25 s and calls every pane due on that beat, one after
the other in the same callback, so Textual folds their refreshes into one screen update: every
second the chart's tick falls with the status bar's and the memory pane's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from textual.app import App
from textual.widget import Widget

BEAT = 0.25  # seconds; every pane interval is a whole number of beats


@dataclass
class PaneTick:
    """One pane's place on the clock; `stop()` takes it off."""

    widget: Widget
    every: int  # beats
    callback: Callable[[], object]
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


class PaneClock:
    """The app's beat: one Textual interval timer, made with the first pane that asks for it."""

    def __init__(self, app: App[object]) -> None:
        self._ticks: list[PaneTick] = []
        self._count = 0
        app.set_interval(BEAT, self._beat, name="pane-clock")

    def add(self, tick: PaneTick) -> None:
        self._ticks.append(tick)

    def _beat(self) -> None:
        self._count += 1
        # Panes that were removed (or stopped) leave the clock; the rest due now are called in turn.
        self._ticks = [t for t in self._ticks if not t.stopped and t.widget.is_attached]
        for tick in list(self._ticks):
            if self._count % tick.every == 0 and not tick.stopped and _can_draw(tick.widget):
                tick.callback()


def _can_draw(widget: Widget) -> bool:
    """Not while the widget is being taken down: an app exiting removes a pane's children before the
    pane, and a beat in between found the chart without its rows (NoMatches, seen in CI). Textual
    says so only in private flags; without them, attached is the best there is."""
    return widget.is_attached and not getattr(widget, "_pruning", False) and not getattr(widget, "_closing", False)


# The app holds its clock (through the clock's timer); this only finds it. Both sides weak: a clock
# held here would hold its panes, and through them the app, for good.
_clocks: weakref.WeakKeyDictionary[App[object], weakref.ref[PaneClock]] = weakref.WeakKeyDictionary()


def on_beat(widget: Widget, interval: float, callback: Callable[[], object]) -> PaneTick:
    """Like `widget.set_interval(interval, callback)`, on the app's shared beat; call from `on_mount`.
    `interval` must be a whole number of beats."""
    beats = interval / BEAT
    if interval <= 0 or abs(beats - round(beats)) > 1e-9:
        raise ValueError(f"a pane interval must be a whole number of {BEAT} s beats, not {interval}")
    app = widget.app
    found = _clocks.get(app)
    clock = found() if found is not None else None
    if clock is None:
        clock = PaneClock(app)
        _clocks[app] = weakref.ref(clock)
    tick = PaneTick(widget, round(beats), callback)
    clock.add(tick)
    return tick
