"""Fewer points of a metric series: for a history replay, and for a chart that should not move for nothing.

A series is a sequence of `(step, value)` pairs in step order (a deque copied with `tuple()`).

- `every_nth` keeps evenly spaced points by position, and always the last one. The session's
  history replay (and the mirror that must read like it) uses it: every point a client gets is a
  real step, and the replay ends at the latest step.
- `steady` keeps the last point of each bucket of `stride` steps, for buckets the run has finished.
  A chart redrawn once a second from `every_nth` picked other raw points each time the series grew
  (the stride moves with the length), so a noisy loss shimmered and the plot had to be drawn again
  every second even when an hour of history gained one pixel's worth of steps. With buckets aligned
  to multiples of a power of two, a finished bucket's point never changes: the picture moves only
  when a bucket finishes (every `stride` steps), and the stride only doubles as the run grows.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TypeVar

P = TypeVar("P", bound=tuple)


def every_nth(points: Sequence[P], max_points: int | None) -> tuple[P, ...]:
    """At most `max_points` points, evenly spaced by position, the last one always kept."""
    copy = tuple(points)
    if max_points and len(copy) > max_points:
        stride = len(copy) / max_points
        copy = tuple(copy[int(i * stride)] for i in range(max_points - 1)) + (copy[-1],)
    return copy


def steady_stride(first: int, last: int, max_points: int) -> int:
    """The smallest power of two that cuts steps `first`..`last` into at most `max_points` buckets.

    Sized from the span with a bucket to spare (a bucket boundary falling inside the span adds one),
    so the stride does not flip back and forth while a window of the same span slides."""
    span = max(last - first, 0)
    stride = 1
    while span // stride + 2 > max_points:
        stride *= 2
    return stride


def steady(points: Sequence[P], max_points: int, now: int) -> tuple[P, ...]:
    """At most `max_points` points that stay put as the series grows (see the module's docstring).

    `now` is the latest step of the run (of any series: a sparse one, such as an evaluation every 500
    steps, is finished up to it). A series of at most `max_points` points is returned whole. Otherwise
    each finished bucket `[k * stride, (k + 1) * stride)` (finished: `(k + 1) * stride <= now`) gives
    its last point, and the bucket still filling gives nothing: a caller that wants the latest point
    adds it itself."""
    copy = tuple(points)
    if max_points < 2 or len(copy) <= max_points:
        return copy
    first, last = copy[0][0], max(copy[-1][0], now)
    stride = steady_stride(first, last, max_points)
    out: list[P] = []
    end = 0
    for bucket in range(first // stride, now // stride):  # the finished ones
        start = end  # where the bucket before ended (the first point's bucket starts at 0)
        end = bisect.bisect_left(copy, ((bucket + 1) * stride,), start)
        if end > start:
            out.append(copy[end - 1])
    return tuple(out)
