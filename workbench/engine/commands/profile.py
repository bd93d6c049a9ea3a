"""`profile N`: record the next N steps with torch.profiler (`profile 0` cancels); the loop feeds and finishes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.engine.actions.profile import ProfileRun
from workbench.engine.dispatch import handles
from workbench.protocol.events import Profile, RunProfile
from workbench.engine.run_state import RunState

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker


@handles(RunProfile)
def run_profile(worker: TrainingWorker, command: RunProfile) -> None:
    steps = command.steps
    if steps == 0:
        if worker._profile is None:
            worker._command_error("`profile 0` cancels a running profile, and none is running")
            return
        worker._publish_or_report("profile", lambda: _cancel(worker))
        return
    if worker._profile is not None:
        worker._command_error(f"already profiling ({worker._profile.remaining} steps to go)")
        return
    if worker.state is not RunState.RUNNING:
        worker._command_error(
            f"profiling records the next {steps} training steps, but training is {worker.state.value}: "
            "resume first (space), then profile"
        )
        return
    try:
        worker._profile = ProfileRun(steps, worker.bench.run_dir, worker.reloader.version, cuda=worker.probe.available())
    except Exception as exc:  # noqa: BLE001
        worker._command_error(f"could not start torch.profiler: {exc}")
        return
    worker.bus.publish(Profile(status="started", steps=steps))


def _cancel(worker: TrainingWorker) -> Profile:
    profile, worker._profile = worker._profile, None
    assert profile is not None
    profile.abort()
    return Profile(status="cancelled", steps=profile.remaining)
