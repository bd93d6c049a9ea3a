"""Optimizer state a snapshot has and `setup()` had no optimizer for: loaded when `step()` makes it.

Trainers that make an optimizer on first use (`if "opt_d" not in state: state["opt_d"] = Adam(...)`,
or a module global) would lose its state on `--resume`: it does not exist when the snapshot is
applied. It is kept here and loaded right after the step that makes it (that one step ran with a
fresh state, and the note says so), or, if none appears within a few steps, said to be lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.actions.snapshot import load_pending_optimizers
from workbench.protocol.events import ResumeLoaded
from workbench.engine.state_walk import Namespaces

# How long after a resume an optimizer that step() makes on first use may take to appear.
PENDING_OPTIMIZER_STEPS = 10


@dataclass
class PendingOptimizers:
    path: Path
    states: dict[str, dict[str, Any]]
    give_up_at: int  # the step after which an optimizer that never appeared is given up
    notes_at_resume: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.notes_at_resume = tuple(
            f"optimizer {name} is in the snapshot but setup() does not make it: its state is loaded as soon as "
            "step() makes it (after that step)"
            for name in self.states
        )

    @classmethod
    def after_resume(cls, path: Path, states: dict[str, dict[str, Any]], step: int) -> PendingOptimizers:
        return cls(path, states, step + PENDING_OPTIMIZER_STEPS)

    @property
    def done(self) -> bool:
        return not self.states

    def after_step(self, state: Any, namespaces: Namespaces, step: int) -> ResumeLoaded | None:
        """Load what appeared; the late `resume` event that says what happened, if anything did."""
        loaded, refused = load_pending_optimizers(self.states, state, namespaces)
        notes = [f"optimizer {name}, made by step(), got its state from the snapshot" for name in loaded]
        notes += [f"optimizer {reason}" for reason in refused]
        if self.states and step >= self.give_up_at:
            notes += [
                f"optimizer {name} is in the snapshot, but no optimizer of that name appeared in "
                f"{PENDING_OPTIMIZER_STEPS} steps: its state was not loaded"
                for name in self.states
            ]
            self.states.clear()
        if not notes:
            return None
        return ResumeLoaded(ok=True, path=str(self.path), step=step, optimizers=len(loaded), notes=tuple(notes), late=True)
