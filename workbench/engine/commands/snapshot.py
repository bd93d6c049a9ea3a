"""`snapshot`: write one now (the writing itself is `TrainingWorker._snapshot`, shared with quit and limits)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.engine.dispatch import handles
from workbench.protocol.events import TakeSnapshot

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker


@handles(TakeSnapshot, needs_state=True, missing="nothing to snapshot yet")
def take_snapshot(worker: TrainingWorker, command: TakeSnapshot) -> None:
    if worker.step == worker._first_step:
        worker._command_error(nothing_trained_yet(worker))
    else:
        worker._snapshot("requested", together=True)


def nothing_trained_yet(worker: TrainingWorker) -> str:
    if worker._first_step == 0:
        return "no snapshot before the first step: it would hold the untrained model, and a later --resume would take it for training"
    return f"no step has run since the resume: step {worker.step} is already in {worker.last_snapshot_path}"
