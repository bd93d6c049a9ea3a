"""The two ways a series is thinned (workbench/protocol/downsample.py): by position for a replay, by finished
buckets of steps for a chart that must not move while nothing it can show has changed."""

from __future__ import annotations

import math
import random
from collections import deque

from workbench.protocol.downsample import every_nth, steady, steady_stride
from workbench.protocol.mirror import TelemetryMirror
from workbench.protocol.events import Evaluation, Step


def noisy(first: int, last: int, seed: int = 0) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(step, 2.0 / math.sqrt(step) + rng.random()) for step in range(first, last + 1)]


def test_every_nth_keeps_evenly_spaced_points_and_the_last():
    points = noisy(1, 1000)
    kept = every_nth(points, 100)
    assert len(kept) == 100 and kept[-1] == points[-1] and kept[0] == points[0]
    assert every_nth(points[:50], 100) == tuple(points[:50])
    assert every_nth(points, None) == tuple(points)


def test_a_short_series_is_kept_whole():
    points = noisy(1, 150)
    assert steady(points, 200, now=150) == tuple(points)


def test_steady_points_are_real_points_in_order_and_at_most_max():
    points = noisy(1, 20_000)
    kept = steady(points, 200, now=20_000)
    assert 100 <= len(kept) <= 200  # a power-of-two stride: between half and all of what was asked
    assert set(kept) <= set(points)
    assert [p[0] for p in kept] == sorted(p[0] for p in kept)


def test_steps_inside_an_unfinished_bucket_change_nothing_and_a_finished_bucket_adds_one_point():
    points = noisy(1, 10_000)
    before = steady(points, 200, now=10_000)
    stride = steady_stride(1, 10_000, 200)
    next_boundary = (10_000 // stride + 1) * stride
    grown = points + noisy(10_001, next_boundary - 1, seed=1)
    assert steady(grown, 200, now=next_boundary - 1) == before  # the bucket still filling shows nothing yet
    grown += noisy(next_boundary, next_boundary, seed=2)
    after = steady(grown, 200, now=next_boundary)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    assert after[-1][0] == next_boundary - 1  # the finished bucket's last step


def test_by_position_the_same_growth_moves_most_points():
    """Why the chart stopped using every_nth: a few more steps pick other raw points almost everywhere."""
    points = noisy(1, 10_000)
    before, after = every_nth(points, 200), every_nth(points + noisy(10_001, 10_020, seed=1), 200)
    assert sum(a != b for a, b in zip(before, after)) > 100


def test_a_sliding_window_keeps_its_stride_and_its_middle():
    window: deque[tuple[int, float]] = deque(maxlen=2_000)
    window.extend(noisy(1, 5_000))
    strides, previous = set(), steady(window, 200, now=5_000)
    for step, value in noisy(5_001, 15_000, seed=3):
        window.append((step, value))
        strides.add(steady_stride(window[0][0], step, 200))
        if step % 500 == 0:
            current = steady(window, 200, now=step)
            shared = set(previous) & set(current)
            assert len(shared) >= len(current) - 500 // 16 - 1  # only what slid out and what finished differs
            previous = current
    assert len(strides) == 1  # a constant span never flips the stride


def test_a_sparse_series_is_finished_up_to_the_runs_latest_step():
    evaluations = [(step, 1.0 / step) for step in range(500, 200_001, 500)]  # 400 evaluations
    assert steady(evaluations, 200, now=200_100)[-1] == evaluations[-2]  # its bucket (1,024 steps) still fills
    kept = steady(evaluations, 200, now=201_000)
    assert 100 <= len(kept) <= 200 and kept[-1] == evaluations[-1]


def test_the_chart_series_end_at_the_latest_point_and_their_rest_stays_put():
    mirror = TelemetryMirror()
    mirror.apply_all(Step(step=n, loss=1.0 / n, ms=1.0, scalars={"lr": 0.1}) for n in range(1, 5_001))
    mirror.apply(Evaluation(step=5_000, scalars={"val_loss": 0.5}))
    first = {s.name: s for s in mirror.chart_series(200)}
    assert first["loss"].steps[-1] == 5_000 and first["val_loss"].steps == (5_000,)
    mirror.apply_all(Step(step=n, loss=float("nan"), ms=1.0, scalars={"lr": 0.1}) for n in range(5_001, 5_004))
    second = {s.name: s for s in mirror.chart_series(200)}
    assert second["loss"].steps[:-1] == first["loss"].steps[:-1] and second["loss"].steps[-1] == 5_003
    assert math.isnan(second["loss"].values[-1]) and second["loss"].steps.count(5_003) == 1
