"""Pane timers tick on one shared beat, so their redraws reach the terminal as one frame."""

from __future__ import annotations

import asyncio
import time

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from workbench.tui.pane_clock import BEAT, on_beat, until_next_beat


def test_until_next_beat_counts_to_the_next_whole_beat() -> None:
    assert until_next_beat(10.0, beat=0.25) == pytest.approx(0.25)
    assert until_next_beat(10.1, beat=0.25) == pytest.approx(0.15)
    assert until_next_beat(10.24, beat=0.25) == pytest.approx(0.01)
    assert 0 < until_next_beat() <= BEAT


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


async def test_timers_started_apart_tick_on_the_same_beats() -> None:
    app = Panes()
    async with app.run_test() as pilot:
        await asyncio.sleep(0.1)  # mounted a while after the first: a plain set_interval would tick 0.1 s apart
        late = Ticking(0.5)
        await app.mount(late)
        first = app.query(Ticking).first()
        deadline = time.monotonic() + 10
        while len(late.ticks) < 3 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert len(late.ticks) >= 3
        for tick in (*first.ticks, *late.ticks):
            off_beat = min(tick % BEAT, BEAT - tick % BEAT)
            assert off_beat < 0.04, f"a tick {off_beat * 1000:.0f} ms off the beat"
        # Each tick of the slower timer falls with one of the faster timer's.
        for tick in late.ticks:
            assert min(abs(tick - other) for other in first.ticks) < 0.04


async def test_an_interval_off_the_beat_is_refused() -> None:
    app = Panes()
    async with app.run_test():
        widget = app.query_one(Ticking)
        with pytest.raises(ValueError, match="whole number of 0.25 s beats"):
            on_beat(widget, 0.3, lambda: None)
