"""`evaluate`: run the user's evaluate() now (`TrainingWorker._run_evaluate`, which `--eval-every` runs too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.engine.dispatch import handles
from workbench.protocol.events import Evaluate

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker


@handles(Evaluate, needs_state=True, missing="nothing to evaluate yet")
def evaluate(worker: TrainingWorker, command: Evaluate) -> None:
    if worker.project.function("evaluate") is None:
        worker._command_error("the project defines no evaluate(state, bench) function")
    else:
        worker._run_evaluate(agreed=True)
