"""The memory lab's keys: the breakdown, the leak census, a CUDA memory snapshot, cleanup."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from workbench.engine.actions.cleanup import run_cleanup
from workbench.engine.actions.memory_snapshot import NeedsCuda
from workbench.engine.dispatch import handles
from workbench.protocol.events import (
    BreakdownReady,
    DumpMemorySnapshot,
    Error,
    FindLeaks,
    LeaksFound,
    RunCleanup,
    ShowBreakdown,
)
from workbench.engine.memory.breakdown import session_breakdown, session_breakdown_for_gpus
from workbench.engine.memory.leaks import find_leaks

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker


@handles(ShowBreakdown, needs_state=True, missing="no breakdown yet")
def show_breakdown(worker: TrainingWorker, command: ShowBreakdown) -> None:
    worker._publish_or_report("breakdown", lambda: breakdown(worker))


@handles(FindLeaks, needs_state=True, missing="no leak census yet")
def find_leaks_now(worker: TrainingWorker, command: FindLeaks) -> None:
    worker._publish_or_report("leaks", lambda: leak_census(worker))


@handles(DumpMemorySnapshot)
def dump_memory_snapshot(worker: TrainingWorker, command: DumpMemorySnapshot) -> None:
    try:
        worker.bus.publish(worker._dump_memory("requested"))
    except NeedsCuda as exc:
        worker._command_error(str(exc))
    except Exception as exc:  # noqa: BLE001
        worker.bus.publish(Error(where="memory snapshot", message=f"memory snapshot failed: {exc}"))


@handles(RunCleanup)
def cleanup(worker: TrainingWorker, command: RunCleanup) -> None:
    worker._publish_or_report("cleanup", lambda: run_cleanup(worker.probe))


def breakdown(worker: TrainingWorker) -> BreakdownReady:
    gpus = worker.probe.gpus() if worker._gpu_index is not None else []
    saved = worker.telemetry.versions.latest_saved_bytes()  # measured on any device: the activations on CPU
    if gpus:
        devices = session_breakdown_for_gpus(worker.user_state, gpus, dict(worker.telemetry.step_peaks), saved_for_backward=saved)
    else:
        devices = session_breakdown(worker.user_state, saved_for_backward=saved)
    return BreakdownReady(step=worker.step, devices=tuple(d.to_dict() for d in devices))


def leak_census(worker: TrainingWorker) -> LeaksFound:
    """Who holds memory the state does not own (also run when a memory limit is near)."""
    namespaces = {m.__name__: m.__dict__ for m in worker.project.modules().values()}
    report = find_leaks(worker.user_state, namespaces=namespaces)
    return LeaksFound(
        step=worker.step,
        total_bytes=report.total_bytes,
        unowned_bytes=report.unowned_bytes,
        seconds=report.seconds,
        groups=tuple(dataclasses.asdict(g) for g in report.groups[:20]),
        suspects=tuple(dataclasses.asdict(s) for s in report.suspects),
    )
