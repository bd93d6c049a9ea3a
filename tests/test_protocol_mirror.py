"""A client attached late draws what the session has: a real Telemetry, replayed through JSON into a
TelemetryMirror, reads the same; then the same events, written to the engine as the worker writes them
and sent to the mirror as JSON lines, keep both the same."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from workbench.protocol.events import Evaluation, Event, Rebuilt, Reload, Step, event_from_json, jsonable
from workbench.engine.memory.cgroup import MemoryCeiling
from workbench.engine.memory.device import GpuMemory as EngineGpu
from workbench.engine.memory.host import HostMemory as EngineHost
from workbench.engine.memory.sampler import MemorySample as EngineSample
from workbench.protocol import payloads
from workbench.protocol.history import build_history
from workbench.protocol.mirror import TelemetryMirror
from workbench.engine.telemetry import Telemetry

GiB = 1024**3


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and a tuple equal to a list of the same items."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def series_of(source: Any, max_points: int | None) -> list[tuple[str, tuple[int, ...], tuple[float, ...]]]:
    return [(s.name, s.steps, s.values) for s in source.series(max_points)]


def gauge_view(sample: Any) -> tuple:
    """What the memory gauges read from a sample (workbench/frontends/tui/widgets/memory_gauges.py)."""
    rates = tuple(sample.allocations_per_step[i] if i < len(sample.allocations_per_step) else None for i in range(len(sample.gpus)))
    gpus = tuple(tuple(getattr(g, name) for name in (*payloads.GPU_FIELDS, "fragmentation")) for g in sample.gpus)
    return (sample.time, tuple(getattr(sample.host, name) for name in payloads.HOST_FIELDS), gpus, sample.gpu_note, rates)


def engine_sample(when: float, i: int, *, gpus: int = 1, cgroup: bool = True) -> EngineSample:
    host = EngineHost(
        rss=GiB + i * 1_000_000, rss_anon=GiB, rss_file=i * 1_000_000, system_total=64 * GiB,
        system_available=40 * GiB - i, swap_used=i % 3 * 4096,
        ceiling=MemoryCeiling(16 * GiB, "cgroup v2 /job-1", usage_bytes=2 * GiB + i) if cgroup else None,
    )
    cards = tuple(
        EngineGpu(index=g, name="NVIDIA H100", uuid=f"GPU-{g}", allocated=(i + 1) * 10_000_000, reserved=(i + 2) * 10_000_000,
                  peak_allocated=(i + 3) * 10_000_000, inactive_split=i * 1000, alloc_retries=i // 10, ooms=0,
                  allocations=i * 500, device_used=(i + 5) * 10_000_000, device_total=80 * GiB, limit=80 * GiB,
                  limit_source="device", utilization=i % 100, temperature=50, power_watts=250.5 + i)
        for g in range(gpus)
    )
    return EngineSample(when, host, cards, None if gpus else "no GPU: CUDA is not available", tuple(float(i) for _ in cards))


class Run:
    """Writes the engine's Telemetry as workbench/engine/worker.py does, and keeps the events it would publish."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.step = 0
        self.version = 0
        self.events: list[Event] = []

    def train(self, n: int, *, loss: float | None = None, pace: float = 0.0) -> None:
        for _ in range(n):
            self.step += 1
            value = loss if loss is not None else 3.0 / self.step
            scalars = {"lr": 1e-3 * (1 + self.step % 7), "grad_norm": 0.5 + self.step % 5}
            peak = 100_000_000 + self.step
            self.telemetry.step_peaks[0] = peak
            ms = 10.0 + self.step % 3
            self.telemetry.record_step(self.step, {"loss": value, **scalars}, ms)
            self.telemetry.versions.record_step(ms, value, scalars, peak)
            self.events.append(Step(step=self.step, loss=value, ms=ms, scalars=scalars, code_version=self.version,
                                    peak_allocated=peak, gpu=0))
            if pace:
                time.sleep(pace)

    def evaluate(self) -> None:
        scalars = {"val_loss": 1.0 / self.step}
        self.telemetry.record_step(self.step, scalars, 0.0, count=False)
        self.telemetry.versions.record_scalars(scalars)
        self.events.append(Evaluation(step=self.step, scalars=scalars, ms=5.0))

    def reload(self, *names: str) -> None:
        self.version += 1
        self.telemetry.record_version(self.step, self.version, names)
        self.events.append(Reload(ok=True, file="train.py", changed=names, code_version=self.version))

    def reload_that_changes_no_version(self) -> None:
        """A held change, a failed reload, statements run, "no code changes": no version starts."""
        self.events += [
            Reload(ok=True, file="train.py", code_version=self.version, held=("Model.__init__",)),
            Reload(ok=False, file="train.py", error="SyntaxError", line=3, code_version=self.version),
            Reload(ok=True, file="train.py", changed=("x",), code_version=self.version, notes=("ran x = 1",)),
            Reload(ok=True, file="train.py", code_version=self.version, notes=("no code changes",)),
            Rebuilt(ok=False, error="setup() raised", code_version=self.version),
        ]

    def rollback(self) -> None:
        undone = self.version
        self.version += 1
        self.telemetry.record_version(self.step, self.version, (f"rollback of v{undone}",))
        self.events.append(Reload(ok=True, file="train.py", changed=("step",), code_version=self.version))

    def rebuild_same_code(self) -> None:
        self.telemetry.record_version(self.step, self.version, ("rebuild",))
        self.telemetry.versions.start(self.version, ("rebuild",), self.step, fresh_state=True)
        self.events.append(Rebuilt(ok=True, code_version=self.version))

    def memory(self, sample: EngineSample) -> None:
        self.telemetry.store_memory(sample)
        # What the sampler's to_event() needs to add for a faithful mirror: the sample's time and swap.
        self.events.append(dataclasses.replace(sample.to_event(), time=sample.time, swap_used_bytes=sample.host.swap_used))

    def send(self, mirror: TelemetryMirror) -> None:
        """The events as the socket carries them: one JSON line each, decoded on the client."""
        for event in self.events:
            mirror.apply(event_from_json(event.to_json()))
        self.events.clear()


def filled_run(steps: int = 600) -> Run:
    run = Run(Telemetry(points=5000))
    start = time.time() - 200
    for i in range(100):  # 200 s of memory samples, 2 s apart
        run.memory(engine_sample(start + 2 * i, i))
        if i == 30:
            run.train(steps // 3)
            run.reload("LR")
        if i == 60:
            run.train(steps // 3, loss=math.nan)  # NaN losses in series, rows and JSON
            run.evaluate()
            run.rollback()
        if i == 90:
            run.train(steps - 2 * (steps // 3), loss=math.inf)
            run.rebuild_same_code()
            run.train(5, pace=0.002)
    run.events.clear()  # what happened before the client attached reaches it through the replay
    return run


def wire(history: dict) -> dict:
    return json.loads(json.dumps(history, allow_nan=False))


def assert_mirrors(mirror: TelemetryMirror, telemetry: Telemetry, *, points: list[int | None], seconds: float) -> None:
    for n in points:
        assert same(series_of(mirror, n), series_of(telemetry, n)), n
    assert mirror.version_starts() == telemetry.version_starts()
    assert [gauge_view(s) for s in mirror.memory_history(seconds)] == [gauge_view(s) for s in telemetry.memory_history(seconds)]
    assert gauge_view(mirror.memory) == gauge_view(telemetry.memory)
    assert mirror.step_peaks == telemetry.step_peaks
    assert mirror.last_step_ms == telemetry.last_step_ms
    for name in ("loss", "lr", "grad_norm", "val_loss", "missing"):
        assert same(mirror.latest(name), telemetry.latest(name)), name
    assert same(mirror.versions.rows(), telemetry.versions.rows())


def test_a_full_replay_reads_like_the_telemetry():
    run = filled_run()
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=1000, full=True)))
    assert_mirrors(mirror, run.telemetry, points=[None, 80, 2000], seconds=1000)
    assert mirror.steps_per_second() == pytest.approx(run.telemetry.steps_per_second(), rel=0.05)
    assert mirror.steps_per_second() > 0


def test_a_downsampled_replay_holds_what_the_telemetry_draws_at_that_size():
    run = filled_run(steps=3000)
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, max_points=200, memory_seconds=1000)))
    assert same(series_of(mirror, None), series_of(run.telemetry, 200))
    assert all(len(s.steps) <= 200 for s in mirror.series())
    assert mirror.series()[0].steps[-1] == run.step  # the last point is always kept


def test_the_memory_replay_covers_the_last_seconds_asked_for():
    run = filled_run()
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=30, full=True)))
    assert [gauge_view(s) for s in mirror.memory_history(10_000)] == [gauge_view(s) for s in run.telemetry.memory_history(30)]
    assert len(mirror.memory_history(10_000)) == 16  # 2 s apart: 30 s and both ends


def test_events_after_the_replay_keep_both_the_same():
    run = filled_run()
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=1000, full=True)))
    seen = mirror.updates
    now = time.time()
    run.train(10)
    run.reload("step", "Model.forward")
    run.reload_that_changes_no_version()
    run.memory(engine_sample(now, 101))
    run.train(5)
    run.evaluate()
    run.rollback()
    run.rebuild_same_code()
    run.memory(engine_sample(now + 0.5, 102, gpus=2))  # a second GPU appears
    run.train(20, pace=0.002)
    run.send(mirror)
    mirror.load_versions(json.loads(json.dumps(jsonable(run.telemetry.versions.rows()), allow_nan=False)))
    assert mirror.updates > seen
    assert mirror.step == run.step and mirror.code_version == run.version
    assert_mirrors(mirror, run.telemetry, points=[None, 80], seconds=1000)
    assert mirror.steps_per_second() == pytest.approx(run.telemetry.steps_per_second(), rel=0.2)
    # And a client that attaches now gets the same from a fresh replay, GPU count change included.
    late = TelemetryMirror()
    late.load_history(wire(build_history(run.telemetry, memory_seconds=1000, full=True)))
    assert_mirrors(late, run.telemetry, points=[None, 80], seconds=1000)


def test_the_gauges_draw_the_same_from_the_mirror():
    from workbench.frontends.tui.widgets.memory_gauges import render_memory

    run = filled_run()
    run.memory(engine_sample(time.time(), 200, gpus=2))
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=300, full=True)))
    drawn = [
        render_memory(source.memory, 30, history=source.memory_history(300), window=300, step_peaks=source.step_peaks)
        for source in (run.telemetry, mirror)
    ]
    assert drawn[0].plain == drawn[1].plain
    assert drawn[0].spans == drawn[1].spans


def test_a_host_without_a_cgroup_and_a_machine_without_a_gpu():
    telemetry = Telemetry()
    telemetry.store_memory(engine_sample(time.time(), 1, gpus=0, cgroup=False))
    run = Run(telemetry)
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(telemetry, memory_seconds=60)))
    assert gauge_view(mirror.memory) == gauge_view(telemetry.memory)
    assert mirror.memory.host.limit_source == "host" and mirror.memory.gpus == ()
    run.memory(engine_sample(time.time() + 1, 2, gpus=0, cgroup=False))
    run.send(mirror)
    assert gauge_view(mirror.memory) == gauge_view(telemetry.memory)


def test_an_empty_session_replays_as_empty():
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(Telemetry(), memory_seconds=60)))
    assert mirror.series() == [] and mirror.memory is None and mirror.memory_history(60) == ()
    assert mirror.steps_per_second() == 0.0 and mirror.last_step_ms is None
    assert [r["version"] for r in mirror.versions.rows()] == [0]


def test_steps_per_second_falls_to_zero_when_steps_stop():
    run = filled_run()
    clock = [time.time()]
    mirror = TelemetryMirror(clock=lambda: clock[0])
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=60, full=True)))
    assert mirror.steps_per_second() > 0
    clock[0] += 10
    assert mirror.steps_per_second() == 0.0


def test_the_versions_table_exports_as_the_engine_does(tmp_path: Path):
    run = filled_run()
    mirror = TelemetryMirror()
    mirror.load_history(wire(build_history(run.telemetry, memory_seconds=60)))
    for fmt in ("csv", "json"):
        ours = mirror.versions.export(tmp_path / "mirror", fmt)
        theirs = run.telemetry.versions.export(tmp_path / "engine", fmt)
        assert ours.read_text() == theirs.read_text()


def test_a_replay_in_a_newer_format_is_refused_with_a_reason():
    history = wire(build_history(Telemetry(), memory_seconds=60))
    history["history"] = 99
    with pytest.raises(ValueError, match="history format 99 is not the one this client reads"):
        TelemetryMirror().load_history(history)


def test_protocol_records_have_the_engine_records_fields():
    assert payloads.GPU_FIELDS == tuple(f.name for f in dataclasses.fields(EngineGpu))
    host = EngineHost(rss=1, rss_anon=1, rss_file=0, system_total=2, system_available=1, swap_used=0)
    for name in payloads.HOST_FIELDS:
        getattr(host, name)  # every field the mirror's host carries, the engine's host can give
    assert {f.name for f in dataclasses.fields(EngineSample)} == {f.name for f in dataclasses.fields(payloads.MemorySample)}


def test_other_ranks_steps_do_not_enter_rank_0s_chart():
    """Under torchrun rank 0 streams every rank's steps; the chart and the step counter stay rank 0's."""
    mirror = TelemetryMirror()
    now = time.time()
    mirror.apply_all([
        Step(step=1, loss=2.0, ms=5.0, code_version=0, rank=0, time=now),
        Step(step=1, loss=9.0, ms=7.0, code_version=0, rank=1, time=now),
        Step(step=2, loss=1.5, ms=5.0, code_version=0, rank=0, time=now + 0.01),
        Step(step=2, loss=8.0, ms=70.0, code_version=0, rank=1, time=now + 0.01),
    ])
    assert mirror.step == 2 and mirror.last_step_ms == 5.0
    loss = next(series for series in mirror.series() if series.name == "loss")
    assert list(loss.values) == [2.0, 1.5]


def test_the_gauges_show_a_row_per_rank_with_the_straggler_marked():
    from workbench.frontends.tui.widgets.memory_gauges import render_memory
    from workbench.protocol.events import Memory, Ranks

    mirror = TelemetryMirror()
    mirror.apply(Memory(rss_bytes=2**30, rss_anon_bytes=2**30, rss_file_bytes=0, system_total_bytes=8 * 2**30,
                        system_available_bytes=4 * 2**30, limit_bytes=8 * 2**30, limit_source="host", gpus=()))
    rows = tuple({"rank": r, "step": 40, "steps_per_second": 9.5, "loss": 1.0, "step_ms": ms, "code_version": 2,
                  "state": "running", "rss_bytes": 2**30, "gpu_allocated_bytes": 3 * 2**30, "gpu_reserved_bytes": None}
                 for r, ms in ((0, 100.0), (1, 101.0), (2, 180.0)))
    mirror.apply(Ranks(ranks=rows, slowest=2))
    shown = render_memory(mirror.memory, ranks=mirror.ranks).plain
    lines = [line for line in shown.splitlines() if line.startswith(" r") and not line.startswith(" rank")]
    assert "Ranks (3)" in shown and " rank    step  it/s    ms   RSS   GPU\n" in shown and len(lines) == 3
    assert lines[2].split() == ["r2", "40", "9.5", "180", "1.0G", "3.0G", "<"], lines[2]
    assert not lines[0].endswith("<") and "< slowest (r2)" in shown
    assert max(len(line) for line in lines) <= 40, "a row per line in the pane's ~40 columns"


def test_ranks_rows_that_stopped_coming_say_how_old_they_are():
    """While a rank holds the others up, no exchange gathers new rows: the last ones are shown with their age, not as
    if current; fresh rows say nothing more."""
    from workbench.frontends.tui.widgets.memory_gauges import render_memory
    from workbench.protocol.events import Memory, Ranks

    mirror = TelemetryMirror()
    mirror.apply(Memory(rss_bytes=2**30, rss_anon_bytes=2**30, rss_file_bytes=0, system_total_bytes=8 * 2**30,
                        system_available_bytes=4 * 2**30, limit_bytes=8 * 2**30, limit_source="host", gpus=()))
    rows = tuple({"rank": r, "step": 40, "steps_per_second": 9.5, "loss": 1.0, "step_ms": 100.0, "code_version": 2,
                  "state": "running", "rss_bytes": 2**30, "gpu_allocated_bytes": None, "gpu_reserved_bytes": None}
                 for r in (0, 1))
    mirror.apply(Ranks(ranks=rows, slowest=None, time=1000.0))
    fresh = render_memory(mirror.memory, ranks=mirror.ranks, now=1001.5).plain
    stale = render_memory(mirror.memory, ranks=mirror.ranks, now=1012.4).plain
    assert "Ranks (2)\n" in fresh and "ago" not in fresh
    assert "Ranks (2)  as of 12 s ago\n" in stale
    assert sum(line.startswith(" r") and not line.startswith(" rank") for line in stale.splitlines()) == 2
    assert " rank    step  it/s    ms   RSS\n" in stale, "no GPU column without GPUs"
    slow_steps = Ranks(ranks=tuple({**row, "step_ms": 30_000.0} for row in rows), slowest=None, time=1000.0)
    assert "ago" not in render_memory(mirror.memory, ranks=slow_steps, now=1040.0).plain  # 30 s steps: one exchange a step
    assert "as of 61 s ago" in render_memory(mirror.memory, ranks=slow_steps, now=1061.0).plain


def test_steps_per_second_counts_only_the_window_and_zero_when_stopped() -> None:
    from workbench.protocol.mirror import steps_per_second

    times = tuple(100.0 + i * 0.1 for i in range(101))  # 10 steps a second for 10 s, the last at 110.0
    assert steps_per_second(times, now=110.0) == pytest.approx(10.0)
    slow_then_fast = tuple([100.0, 101.0, 102.0] + [108.0 + i * 0.05 for i in range(41)])  # 20/s over the last 2 s
    assert steps_per_second(slow_then_fast, now=110.0) == pytest.approx(20.0)  # the 1/s steps fell out of the window
    assert steps_per_second(times, now=114.0) == 0.0  # nothing for longer than the window: stopped or paused
    assert steps_per_second((110.0,), now=110.0) == 0.0
