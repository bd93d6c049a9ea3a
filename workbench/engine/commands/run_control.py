"""Pause, resume, a single step, quit: the loop's own state, changed between steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.engine.dispatch import handles
from workbench.protocol.events import Command, Pause, Quit, Resume, StepOnce
from workbench.engine.run_state import AUTO_RESUME_REASONS, RunState

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker


@handles(Quit)
def quit_(worker: TrainingWorker, command: Quit) -> None:
    if command.final_snapshot and worker.user_state is not None:
        worker._final_snapshot(together=True)
    worker._quit = True
    if command.reason != "quit":
        worker._end_for(command.reason)


@handles(Pause)
def pause(worker: TrainingWorker, command: Pause) -> None:
    if worker.state is RunState.RUNNING:
        worker._pause("user")


@handles(Resume)
def resume(worker: TrainingWorker, command: Resume) -> None:
    if worker.state is RunState.SETUP_FAILED:
        worker._command_error("setup() failed, so there is nothing to resume: fix it and save to run setup again")
    elif worker.state is RunState.PAUSED and worker.broken is not None and worker.pause_reason in AUTO_RESUME_REASONS:
        worker._recover()  # under torchrun, after a dead collective or a DDP reducer error: rebuild, then resume
    elif worker.state is RunState.PAUSED:
        worker._resume("user")


@handles(StepOnce)
def step_once(worker: TrainingWorker, command: StepOnce) -> None:
    if (worker.state is RunState.PAUSED and worker.broken is not None and worker.pause_reason in AUTO_RESUME_REASONS
            and worker.lockstep is None):
        # The state cannot train (a generator an error ended): rebuilt first, as `resume` does, then the one step; a
        # step alone would fail again the same way. Under torchrun `resume` does it: a rebuild there makes the process
        # groups again, which every rank must enter at one turn, and a `step` sent while one rank was still inside a
        # training collective led one rank into that alone (minGPT under DDP, ported); there the step runs as sent.
        worker._recover()
        if worker.broken is not None:
            return  # the rebuild failed, and said why: the step would fail as the last one did
        if worker.state is RunState.RUNNING:
            worker._pause("user")
    if worker.state is RunState.PAUSED:
        worker._step_once = True
        if worker.lockstep is not None:
            worker.lockstep.after_one_step(worker)  # what its step is due for (--eval-every...), at the next boundary
    else:
        worker._command_error(f"`step` runs a single step while paused; training is {worker.state.value}")


@dataclass(frozen=True)
class InputClosed(Command):
    """Internal, from the headless front end: its stdin ended, so nobody can send a command any more."""


@handles(InputClosed)
def input_closed(worker: TrainingWorker, command: InputClosed) -> None:
    """Training goes on (a script may close stdin and let it run to --max-steps), but a pause now waits for nobody: a
    run already paused ends (every rank under torchrun), and any pause from now on ends it. A pause of the user's
    (`--paused`, `pause`) waited forever, holding the model and its GPU (a driver script that died)."""
    worker.exit_on_error_pause = True
    if worker.held_for_planned_end:
        return  # at the last of --max-steps, every rank ends at the next boundary (what is due after it first)
    if worker.state is RunState.PAUSED and worker.pause_reason is not None:
        # Under torchrun every rank is here at one boundary, after every command sent before the end of input.
        worker.end_without_input(worker.pause_reason)
