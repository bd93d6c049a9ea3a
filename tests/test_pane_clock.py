"""Pane timers tick on one shared beat, so their redraws reach the terminal as one frame."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from workbench.frontends.tui.pane_clock import on_beat


class Ticking(Static):
    """Records the monotonic time of each tick of an on-beat timer."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self.ticks: list[float] = []

    def on_mount(self) -> None:
        on_beat(self, self.interval, lambda: self.ticks.append(time.monotonic()))


class Panes(App[None]):
    def compose(self) -> ComposeResult:
        yield Ticking(0.25)


async def test_panes_mounted_apart_tick_together() -> None:
    app = Panes()
    async with app.run_test() as pilot:
        await asyncio.sleep(0.1)  # mounted a while after the first: a set_interval each would tick 0.1 s apart
        late = Ticking(0.5)
        await app.mount(late)
        first = app.query(Ticking).first()
        deadline = time.monotonic() + 10
        while len(late.ticks) < 3 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert len(late.ticks) >= 3
        # Every tick of the slower pane comes in the same beat as one of the faster pane's, back to
        # back in one callback (so in one screen update), however late the beat itself was.
        for tick in late.ticks:
            assert min(abs(tick - other) for other in first.ticks) < 0.005
        assert all(b - a > 0.3 for a, b in zip(late.ticks, late.ticks[1:]))  # every other beat, not every beat
        assert len(first.ticks) >= 2 * len(late.ticks) - 1


async def test_a_removed_pane_leaves_the_clock() -> None:
    app = Panes()
    async with app.run_test() as pilot:
        gone = Ticking(0.25)
        await app.mount(gone)
        deadline = time.monotonic() + 10
        while not gone.ticks and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await gone.remove()
        removed_at = len(gone.ticks)
        await pilot.pause(0.6)
        assert len(gone.ticks) == removed_at
        assert app.query_one(Ticking).ticks  # the other pane still ticks


async def test_a_stopped_ticker_ticks_no_more() -> None:
    app = Panes()
    async with app.run_test() as pilot:
        calls: list[float] = []
        ticker = on_beat(app.query_one(Ticking), 0.25, lambda: calls.append(time.monotonic()))
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert len(calls) >= 2
        ticker.stop()
        stopped_at = len(calls)
        await pilot.pause(0.6)
        assert len(calls) == stopped_at


async def test_an_interval_off_the_beat_is_refused() -> None:
    app = Panes()
    async with app.run_test():
        widget = app.query_one(Ticking)
        with pytest.raises(ValueError, match="whole number of 0.25 s beats"):
            on_beat(widget, 0.3, lambda: None)


class PaneOfItsApp(Ticking):
    """A pane that keeps a reference to its app (or to something the app owns), as panes do."""

    def on_mount(self) -> None:
        super().on_mount()
        self.owner = self.app


class AppWithSuchAPane(App[None]):
    def compose(self) -> ComposeResult:
        yield PaneOfItsApp(0.25)


async def test_an_app_that_ended_is_not_kept_alive_by_its_clock() -> None:
    async def run_once() -> weakref.ref[App[None]]:
        app = AppWithSuchAPane()
        async with app.run_test() as pilot:
            await pilot.pause(0.3)
        return weakref.ref(app)

    # In a task of its own: Textual keeps the running app in a context variable of the task.
    gone = await asyncio.create_task(run_once())
    gc.collect()
    assert gone() is None
