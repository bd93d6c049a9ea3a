"""The session's telemetry on the client's side: the reading API the TUI uses on `Telemetry`, fed by
a history replay and then by events.

    mirror = TelemetryMirror()
    mirror.load_history(hello["history"])     # what build_history() made, after JSON
    for event in stream: mirror.apply(event)  # Step, Evaluation, Reload, Rebuilt, ResumeLoaded, Memory
    mirror.load_versions(message["rows"])     # the periodic {"wire": "versions", "rows": [...]}

It folds events the way the worker writes `Telemetry` (workbench/engine/worker.py): a step
appends "loss" and its scalars to the series and counts toward steps/s; an
evaluation appends its scalars only; a reload that moved the code version, a
rollback and a rebuild start a version at the last step seen. The versions table
is not recomputed here: its rows are the session's, from the replay and each refresh.

Written only by the thread that calls `load_history`, `apply` and `load_versions`;
the widgets read it on that same thread (the app's pane clock).
"""

from __future__ import annotations

import bisect
import csv
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.protocol.events import (
    Evaluation,
    Event,
    Memory,
    Ranks,
    Rebuilt,
    Reload,
    ResumeLoaded,
    Step,
    float_from_json,
)
from workbench.protocol.downsample import every_nth, steady
from workbench.protocol.history import HISTORY_FORMAT
from workbench.protocol.payloads import GPU_FIELDS, HOST_FIELDS, GpuMemory, HostMemory, MemorySample, sample_from_event

SERIES_POINTS = 20_000  # as workbench/engine/telemetry.py keeps
STEP_TIMES = 512


@dataclass(frozen=True)
class Series:
    name: str
    steps: tuple[int, ...]
    values: tuple[float, ...]


class VersionRows:
    """The versions table as the session last sent it: `rows()` and `export()` as on `VersionTable`."""

    _FLOATS = ("median_step_ms", "steps_per_second", "mean_loss")

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []

    def load(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rows as JSON has them (VersionTable.rows() through `jsonable`)."""
        loaded = []
        for row in rows:
            row = dict(row)
            row["changed"] = tuple(row.get("changed") or ())
            for key in self._FLOATS:
                row[key] = float_from_json(row.get(key))
            row["scalars"] = {k: float_from_json(v) for k, v in (row.get("scalars") or {}).items()}
            loaded.append(row)
        self._rows = loaded

    def rows(self) -> list[dict[str, Any]]:
        return [{**row, "scalars": dict(row["scalars"])} for row in self._rows]

    def export(self, folder: Path, fmt: str) -> Path:
        """Write the table to `<folder>/versions-<time>.csv|json`, as VersionTable.export does."""
        folder.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        path = folder / f"versions-{time.strftime('%Y%m%d-%H%M%S')}.{fmt}"
        if fmt == "json":
            path.write_text(json.dumps(rows, indent=2, default=list))
        else:
            columns = [k for k in rows[0] if k != "scalars"] if rows else []
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
                writer.writeheader()
                for row in rows:
                    writer.writerow({**row, "changed": " ".join(row["changed"])})
        return path


class TelemetryMirror:
    """Reads like `workbench.engine.telemetry.Telemetry`: series, latest, version_starts, memory,
    memory_history, step_peaks, steps_per_second, last_step_ms, updates, versions."""

    def __init__(self, points: int = SERIES_POINTS, memory_history: int = 3000, *, clock: Callable[[], float] = time.time) -> None:
        self._points = points
        self._clock = clock  # wall clock: step times are the events' own times
        self._series: dict[str, deque[tuple[int, float]]] = {}
        self._memory_history: deque[MemorySample] = deque(maxlen=memory_history)
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES)
        self._version_starts: deque[tuple[int, int]] = deque(maxlen=1000)
        self.memory: MemorySample | None = None
        self.step_peaks: dict[int, int] = {}
        self.versions = VersionRows()
        self.last_step_ms: float | None = None
        self.updates = 0
        self.step = 0  # the last step seen: where a version that starts now starts
        self.code_version = 0
        self.ranks: Ranks | None = None  # under torchrun: rank 0's last summary of every rank
        self._fold: dict[type[Event], Callable[[Any], None]] = {
            Step: self._step,
            Evaluation: self._evaluation,
            Reload: self._reload,
            Rebuilt: self._rebuilt,
            ResumeLoaded: self._resume,
            Memory: self._memory,
            Ranks: self._ranks,
        }

    # Writers --------------------------------------------------------------------------------
    def load_history(self, history: dict[str, Any]) -> None:
        """Start from a replay (build_history's dict, after JSON); what the mirror held is replaced."""
        found = history.get("history")
        if found != HISTORY_FORMAT:
            raise ValueError(
                f"history format {found!r} is not the one this client reads ({HISTORY_FORMAT}): "
                "attach with the vram-bench version that runs the session"
            )
        self._series.clear()
        for s in history["series"]:
            points = zip(s["steps"], (float_from_json(v) for v in s["values"]))
            self._series[s["name"]] = deque(points, maxlen=self._points)
        now = self._clock()
        self._step_times.clear()
        self._step_times.extend(now - ago for ago in history["step_times_ago"])
        self.last_step_ms = float_from_json(history["last_step_ms"])
        self._memory_history.clear()
        self._memory_history.extend(samples_from_columns(history["memory"]))
        self.memory = self._memory_history[-1] if self._memory_history else None
        self.step_peaks = {int(gpu): peak for gpu, peak in history["step_peaks"].items()}
        starts = history["version_starts"]
        self._version_starts.clear()
        self._version_starts.extend(zip(starts["steps"], starts["versions"]))
        self.versions.load(history["versions"])
        self.step = history["step"]
        self.code_version = history["code_version"]
        self.updates += 1

    def load_versions(self, rows: Iterable[dict[str, Any]]) -> None:
        """The session's periodic `{"wire": "versions", "rows": [...]}`."""
        self.versions.load(rows)

    def apply(self, event: Event) -> None:
        """Fold one event in; events that carry no telemetry are ignored."""
        fold = self._fold.get(type(event))
        if fold is not None:
            fold(event)

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def _append(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            series = self._series.get(name)
            if series is None:
                series = self._series.setdefault(name, deque(maxlen=self._points))
            series.append((step, value))
        self.updates += 1

    def _start_version(self, version: int) -> None:
        self._version_starts.append((self.step, version))
        self.code_version = version
        self.updates += 1

    def _step(self, event: Step) -> None:
        if event.rank:  # another rank's step (torchrun): the chart and counters are rank 0's
            return
        if event.code_version != self.code_version:
            self._start_version(event.code_version)  # only when the reload's own event was lost
        self._append(event.step, {"loss": event.loss, **event.scalars})
        self._step_times.append(event.time)
        self.last_step_ms = event.ms
        self.step = event.step
        if event.peak_allocated is not None and event.gpu is not None:
            self.step_peaks[event.gpu] = event.peak_allocated

    def _ranks(self, event: Ranks) -> None:
        self.ranks = event

    def _evaluation(self, event: Evaluation) -> None:
        self.step = event.step
        self._append(event.step, dict(event.scalars))

    def _reload(self, event: Reload) -> None:
        # The version moves on an applied change and on a rollback; not on a held change, a failed
        # reload, run statements or "no code changes".
        if event.ok and event.code_version != self.code_version:
            self._start_version(event.code_version)

    def _rebuilt(self, event: Rebuilt) -> None:
        if event.ok:  # a rebuild is a version start even with the same code (fresh state)
            self._start_version(event.code_version)

    def _resume(self, event: ResumeLoaded) -> None:
        if event.ok:
            self.step = event.step

    def _memory(self, event: Memory) -> None:
        sample = sample_from_event(event)
        self.memory = sample
        self._memory_history.append(sample)

    # Readers (as on Telemetry) --------------------------------------------------------------------
    def series(self, max_points: int | None = None) -> list[Series]:
        """Every series, downsampled to at most `max_points` points (the last point is always kept)."""
        return replay_series(self._series, max_points)

    def chart_series(self, max_points: int) -> list[Series]:
        return chart_series(self._series, max_points)

    def latest(self, name: str) -> float | None:
        series = self._series.get(name)
        return series[-1][1] if series else None

    def version_starts(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._version_starts)

    def memory_history(self, seconds: float) -> tuple[MemorySample, ...]:
        """Samples of the last `seconds` (oldest first) for the gauges' history lines."""
        samples = tuple(self._memory_history)
        if not samples:
            return ()
        cutoff = samples[-1].time - seconds
        return tuple(s for s in samples if s.time >= cutoff)

    def steps_per_second(self, window: float = 3.0) -> float:
        return steps_per_second(tuple(self._step_times), self._clock(), window)


def replay_series(series: dict[str, deque[tuple[int, float]]], max_points: int | None) -> list[Series]:
    """Every series thinned by position (`every_nth`), as the history replay sends them; the engine's Telemetry
    reads the same, so a client's mirror and the session agree point for point."""
    out = []
    for name, points in list(series.items()):
        kept = every_nth(points, max_points)
        out.append(Series(name, tuple(p[0] for p in kept), tuple(p[1] for p in kept)))
    return out


def chart_series(series: dict[str, deque[tuple[int, float]]], max_points: int) -> list[Series]:
    """Every series as a chart draws it: points that stay put while the run grows (`steady`), then the latest
    point. All but the last point change only when a bucket of steps finishes, so a chart can leave the screen
    alone in between (workbench/protocol/downsample.py says why). The engine's Telemetry reads the same."""
    copies = {name: tuple(points) for name, points in list(series.items())}
    now = max((points[-1][0] for points in copies.values() if points), default=0)
    out = []
    for name, points in copies.items():
        kept = steady(points, max_points, now)
        if points and (not kept or kept[-1] is not points[-1]):  # identity: a NaN loss is not equal to itself
            kept = (*kept, points[-1])
        out.append(Series(name, tuple(p[0] for p in kept), tuple(p[1] for p in kept)))
    return out


def steps_per_second(times: tuple[float, ...], now: float, window: float = 3.0) -> float:
    """Steps per second over the last `window` s of step end `times` (oldest first); 0 when stopped or paused.
    The engine's Telemetry and the client's mirror both count this way."""
    if len(times) < 2 or now - times[-1] > window:
        return 0.0
    first = bisect.bisect_left(times, now - window)  # times are in order: a search, not a scan (rank exchanges ask)
    count = len(times) - first
    if count < 2 or times[-1] <= times[first]:
        return 0.0
    return (count - 1) / (times[-1] - times[first])


def samples_from_columns(memory: dict[str, Any]) -> list[MemorySample]:
    """The inverse of history.memory_columns."""
    times = memory["times"]
    host = memory["host"]
    hosts = [HostMemory(**{name: host[name][i] for name in HOST_FIELDS if name in host}) for i in range(len(times))]
    tables = [
        {name: [float_from_json(v) for v in table[name]] if name == "power_watts" else table[name] for name in GPU_FIELDS if name in table}
        for table in memory["gpus"]
    ]
    rates = [[float_from_json(v) for v in table.get("allocations_per_step", [None] * len(times))] for table in memory["gpus"]]
    samples = []
    for i, when in enumerate(times):
        gpus, gpu_rates = [], []
        for table, rate in zip(tables, rates):
            if table["index"][i] is None:
                continue  # this sample had fewer GPUs
            gpus.append(GpuMemory(**{name: column[i] for name, column in table.items()}))
            gpu_rates.append(rate[i])
        samples.append(MemorySample(when, hosts[i], tuple(gpus), memory["gpu_note"][i], tuple(gpu_rates)))
    return samples
