"""The memory forecast: a sustained climb is forecast and acted on in time; flat, sawtooth and one jump are not."""

from __future__ import annotations

import random

from workbench.engine.memory.forecast import MemoryForecast

MB = 1 << 20
GB = 1 << 30


def feed(forecast: MemoryForecast, series, ceiling=2 * GB, act_within=8.0):  # type: ignore[no-untyped-def]
    return [(t, change) for t, used in series if (change := forecast.add(t, int(used), ceiling, act_within))]


def test_a_flat_noisy_run_for_two_minutes_raises_nothing() -> None:
    rng = random.Random(0)
    series = [(i / 10, 1.2 * GB + rng.uniform(-40, 40) * MB) for i in range(1200)]
    assert feed(MemoryForecast(), series) == []


def test_a_sawtooth_of_memory_freed_every_step_is_no_trend() -> None:
    series = [(i / 10, 1.0 * GB + (i % 8) * 60 * MB) for i in range(1200)]  # 480 MB up, then freed, each step
    assert feed(MemoryForecast(), series) == []


def test_one_jump_is_no_trend() -> None:
    series = [(i / 10, (1.0 * GB if i < 300 else 1.6 * GB)) for i in range(1200)]
    assert feed(MemoryForecast(), series) == []


def test_a_steady_leak_is_warned_then_acted_on_before_the_ceiling_and_cleared_when_it_stops() -> None:
    rate = 50 * MB
    climb = [(i / 10, 0.5 * GB + rate * i / 10) for i in range(300)]  # 50 MB/s from 0.5 GB: 2 GB at t = 30.7 s
    changes = feed(MemoryForecast(warn_horizon=25.0), climb)
    kinds = [c.kind for _, c in changes]
    assert kinds == ["warn", "act"], changes
    warn_at, warned = changes[0]
    act_at, acted = changes[1]
    assert abs(warned.trend.rate - rate) < 0.01 * rate
    assert warn_at < act_at and 30.7 - act_at >= 8.0 - 0.2, f"acted at {act_at:.1f} s: too late for an 8 s snapshot"
    assert acted.trend.seconds_left <= 8.0

    forecast = MemoryForecast(warn_horizon=25.0)
    feed(forecast, climb[:200])
    flat_after = [(20 + i / 10, 0.5 * GB + rate * 20) for i in range(1, 120)]
    cleared = feed(forecast, flat_after)
    assert [c.kind for _, c in cleared] == ["clear"] and cleared[0][0] >= 20 + 5.0
    assert forecast.warning is None


def test_a_slow_leak_far_from_the_ceiling_is_not_an_emergency() -> None:
    series = [(i / 10, 0.5 * GB + 8 * MB * i / 10) for i in range(600)]  # 8 MB/s, 1.5 GB of room: ~190 s
    assert feed(MemoryForecast(warn_horizon=60.0), series) == []
    assert [c.kind for _, c in feed(MemoryForecast(warn_horizon=300.0), series)] == ["warn"]


def test_no_ceiling_no_forecast() -> None:
    series = [(i / 10, 0.5 * GB + 50 * MB * i / 10) for i in range(300)]
    assert feed(MemoryForecast(), series, ceiling=None) == []


def test_memory_one_long_step_builds_up_is_no_trend_but_the_same_climb_across_steps_is() -> None:
    climb = [(i / 10, 0.5 * GB + 100 * MB * i / 10) for i in range(120)]  # 100 MB/s for 12 s toward 2 GB
    one_step = MemoryForecast()
    assert [c for t, used in climb if (c := one_step.add(t, int(used), 2 * GB, 5.0, step=7))] == []
    across = MemoryForecast()
    kinds = [c.kind for i, (t, used) in enumerate(climb) if (c := across.add(t, int(used), 2 * GB, 5.0, step=i // 5))]
    assert kinds == ["warn", "act"]


def test_a_ramp_over_a_few_slow_steps_that_is_then_freed_is_not_warned_about() -> None:
    # The flat run of test_memory_limit.py under load: 40 MB more each step for 6 steps of 0.6 s, then freed.
    series, step = [], 0
    for i in range(1200):
        t = i / 10
        step = int(t / 0.6)
        series.append((t, 0.8 * GB + (1 + step % 6) * 40 * MB, step))
    forecast = MemoryForecast()
    changes = [c for t, used, s in series if (c := forecast.add(t, int(used), 24 * GB, 3.0, step=s))]
    assert changes == []
