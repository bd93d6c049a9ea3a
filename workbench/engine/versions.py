"""Per-version figures: every save is an experiment, so measure each code version's steps.

The training thread appends (no locks: plain attribute writes and deque appends);
front ends read `rows()`. Peaks are per version because step peaks are reset at
every step; on CPU, "saved bytes per step" (what autograd keeps for backward,
measured on a few steps of each version) is the memory figure that still means
something.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOSS_WINDOW = 20  # mean loss over a version's last steps
SAVED_MEASURE_STEPS = 3  # steps per version measured with saved-tensor hooks (they cost a little)


@dataclass
class VersionStats:
    version: int
    changed: tuple[str, ...]
    started_step: int
    started_at: float = field(default_factory=time.time)
    steps: int = 0
    step_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    losses: deque[float] = field(default_factory=lambda: deque(maxlen=LOSS_WINDOW))
    saved: list[int] = field(default_factory=list)
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    peak_rss: int | None = None
    scalars: dict[str, float] = field(default_factory=dict)  # last value of every other series (logs, evaluate)

    def row(self) -> dict[str, Any]:
        ms = list(self.step_ms)
        median = statistics.median(ms) if ms else None
        return {
            "version": self.version,
            "changed": self.changed,
            "started_step": self.started_step,
            "steps": self.steps,
            "median_step_ms": round(median, 3) if median is not None else None,
            "steps_per_second": round(1000 / median, 3) if median else None,
            "saved_bytes_per_step": max(self.saved) if self.saved else None,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "peak_rss": self.peak_rss,
            "mean_loss": round(statistics.fmean(self.losses), 6) if self.losses else None,
            "scalars": dict(self.scalars),
        }


class VersionTable:
    def __init__(self) -> None:
        self._versions: list[VersionStats] = [VersionStats(0, (), 0)]

    @property
    def current(self) -> VersionStats:
        return self._versions[-1]

    # Writer: the training thread ---------------------------------------------------------
    def start(self, version: int, changed: tuple[str, ...], step: int, *, fresh_state: bool = False) -> None:
        """A new row when the code version changes, or when a rebuild made the state anew."""
        if version != self.current.version or fresh_state:
            self._versions.append(VersionStats(version, changed, step))

    def wants_saved_measurement(self) -> bool:
        return len(self.current.saved) < SAVED_MEASURE_STEPS

    def record_step(self, ms: float, loss: float, scalars: dict[str, float], peak_allocated: int | None) -> None:
        v = self.current
        v.steps += 1
        v.step_ms.append(ms)
        v.losses.append(loss)
        v.scalars.update(scalars)
        if peak_allocated is not None:
            v.peak_allocated = max(v.peak_allocated or 0, peak_allocated)

    def record_saved(self, nbytes: int) -> None:
        self.current.saved.append(nbytes)

    def record_scalars(self, scalars: dict[str, float]) -> None:
        self.current.scalars.update(scalars)

    # Writer: the memory sampler ----------------------------------------------------------
    def record_memory(self, rss: int, reserved: int | None) -> None:
        v = self.current
        v.peak_rss = max(v.peak_rss or 0, rss)
        if reserved is not None:
            v.peak_reserved = max(v.peak_reserved or 0, reserved)

    # Readers -------------------------------------------------------------------------------
    def latest_saved_bytes(self) -> int | None:
        """Bytes autograd saved for backward in the current version's latest measured step; None before one."""
        saved = self.current.saved
        return saved[-1] if saved else None

    def rows(self) -> list[dict[str, Any]]:
        rows = [v.row() for v in list(self._versions)]
        previous = None
        for row in rows:
            row["delta"] = describe_delta(previous, row) if previous else ""
            if row["steps"]:
                previous = row
        return rows

    def export(self, folder: Path, fmt: str) -> Path:
        """Write the table to `<folder>/versions-<time>.csv|json`."""
        folder.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        path = folder / f"versions-{time.strftime('%Y%m%d-%H%M%S')}.{fmt}"
        if fmt == "json":
            path.write_text(json.dumps(rows, indent=2, default=list))
        else:
            columns = [k for k in rows[0] if k != "scalars"]
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
                writer.writeheader()
                for row in rows:
                    writer.writerow({**row, "changed": " ".join(row["changed"])})
        return path


_COMPARED = (
    ("saved_bytes_per_step", "saved activations"),
    ("peak_allocated", "peak memory"),
    ("median_step_ms", "step time"),
    ("mean_loss", "loss"),
)


def describe_delta(before: dict[str, Any], after: dict[str, Any]) -> str:
    """'-38% saved activations, +12% step time' against the previous version that ran steps."""
    parts = []
    for key, label in _COMPARED:
        a, b = before.get(key), after.get(key)
        if a and b is not None:
            change = (b - a) / a
            if change > 9:
                parts.append(f"x{b / a:.0f} {label}")  # from next to nothing: a ratio reads better than +110008%
            elif abs(change) >= 0.01:
                parts.append(f"{change:+.0%} {label}")
    return ", ".join(parts)
