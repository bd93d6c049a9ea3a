"""The replay a client gets when it attaches: what the session's telemetry holds, in columns.

`build_history(telemetry, memory_seconds=...)` reads a `workbench.engine.telemetry.Telemetry`
through its reading API only (duck-typed: this module never imports the engine),
and returns a JSON-able dict; `TelemetryMirror.load_history` (mirror.py) reads it.
Columns, not one object per point: a series is two lists, a memory field one list,
which is what keeps a replay of hours small (bench/replay_history.py measures it).

Layout (HISTORY_FORMAT 1); NaN/Inf travel as "nan"/"inf"/"-inf", as in events:

    {"history": 1, "full": bool, "max_points": int | None,
     "step": int,                  # the last step any series has (0 before one)
     "code_version": int,          # the live code version (the versions table's last row)
     "series": [{"name", "steps": [...], "values": [...]}, ...],   # Telemetry.series(max_points)
     "last_step_ms": float | None,
     "step_times_ago": [...],      # seconds before the replay was built, oldest first (steps/s)
     "memory": {"seconds": float, "times": [...],
                "host": {"rss": [...], "rss_anon": [...], ... one list per HostMemory field},
                "gpu_note": [...],
                "gpus": [{"index": [...], "allocated": [...], ... one list per GpuMemory field,
                          "allocations_per_step": [...]}, ...]},   # one table per GPU slot; null where
                                                                   # a sample had fewer GPUs
     "step_peaks": {"0": bytes, ...},
     "version_starts": {"steps": [...], "versions": [...]},
     "versions": [row, ...]}       # VersionTable.rows(), as JSON has them
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from workbench.protocol.events import jsonable
from workbench.protocol.payloads import GPU_FIELDS, HOST_FIELDS

HISTORY_FORMAT = 1


def build_history(telemetry: Any, *, max_points: int = 2000, memory_seconds: float, full: bool = False) -> dict[str, Any]:
    """A JSON-able replay of `telemetry`: every series downsampled to `max_points` (`full=True`: every
    point), the memory samples of the last `memory_seconds`, step peaks, version starts and the
    versions table. Safe to call from any thread: it reads through Telemetry's own copying readers."""
    now = time.monotonic()  # Telemetry keeps step times on the monotonic clock
    series = telemetry.series(None if full else max_points)
    rows = telemetry.versions.rows()
    starts = telemetry.version_starts()
    return {
        "history": HISTORY_FORMAT,
        "full": full,
        "max_points": None if full else max_points,
        "step": max((s.steps[-1] for s in series if s.steps), default=0),
        "code_version": rows[-1]["version"] if rows else (starts[-1][1] if starts else 0),
        "series": [{"name": s.name, "steps": list(s.steps), "values": _numbers(s.values)} for s in series],
        "last_step_ms": jsonable(telemetry.last_step_ms),
        "step_times_ago": [now - t for t in _step_times(telemetry)],
        "memory": memory_columns(telemetry.memory_history(memory_seconds), memory_seconds),
        "step_peaks": {str(gpu): peak for gpu, peak in dict(telemetry.step_peaks).items()},
        "version_starts": {"steps": [s for s, _ in starts], "versions": [v for _, v in starts]},
        "versions": jsonable(rows),
    }


def memory_columns(samples: Sequence[Any], seconds: float) -> dict[str, Any]:
    """Memory samples (the engine's MemorySample or the protocol's) as columns."""
    slots = max((len(s.gpus) for s in samples), default=0)
    gpus = []
    for i in range(slots):
        here = [s.gpus[i] if i < len(s.gpus) else None for s in samples]
        table = {name: _numbers([getattr(g, name, None) if g is not None else None for g in here]) for name in GPU_FIELDS}
        table["allocations_per_step"] = _numbers(
            [s.allocations_per_step[i] if i < len(s.allocations_per_step) else None for s in samples]
        )
        gpus.append(table)
    return {
        "seconds": seconds,
        "times": [s.time for s in samples],
        "host": {name: [getattr(s.host, name) for s in samples] for name in HOST_FIELDS},
        "gpu_note": [s.gpu_note for s in samples],
        "gpus": gpus,
    }


def _step_times(telemetry: Any) -> tuple[float, ...]:
    """The recent steps' monotonic times: `step_times()` where the engine has it, else its ring buffer."""
    reader = getattr(telemetry, "step_times", None)
    if callable(reader):
        return tuple(reader())
    return tuple(getattr(telemetry, "_step_times", ()))


def _numbers(values: Sequence[Any]) -> list[Any]:
    """A column as JSON takes it: NaN/Inf as text (the common all-finite case without a call per value)."""
    out = list(values)
    try:
        if math.isfinite(sum(out)):  # NaN and Inf carry through a sum (an overflow only costs the slow path)
            return out
    except TypeError:  # None among them (a figure that is not available)
        pass
    for i, v in enumerate(out):
        if v.__class__ is float and not math.isfinite(v):
            out[i] = jsonable(v)
    return out
