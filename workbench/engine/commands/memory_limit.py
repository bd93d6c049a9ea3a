"""Internal, from the memory guard: the ceiling is near; act before the kernel's kill."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.engine.commands.memory import leak_census
from workbench.engine.dispatch import handles
from workbench.protocol.events import Error
from workbench.engine.memory_guard import MemoryLimitNear
from workbench.engine.run_state import RunState

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker

MEMORY_ACTIONS = {
    "snapshot": "writing a snapshot and pausing (save a fix to resume, or press space to go on)",
    "pause": "pausing (save a fix to resume, or press space to go on)",
    "warn": "training goes on (--on-memory-limit warn)",
}


@handles(MemoryLimitNear)
def memory_limit_near(worker: TrainingWorker, near: MemoryLimitNear) -> None:
    """A snapshot (with time to write it) and a pause, with who holds the memory; as `--on-memory-limit` says."""
    if worker.state is not RunState.RUNNING or worker.user_state is None:
        return  # paused already: nothing grows
    worker.bus.publish(Error(where="memory limit", message=f"{near.sentence}: {MEMORY_ACTIONS[worker.on_memory_limit]}"))
    if worker.on_memory_limit == "warn":
        return
    if worker.on_memory_limit == "snapshot" and worker.step != worker._first_step and worker.step != worker.last_snapshot_step:
        worker._snapshot("memory limit", together=True)
    worker._publish_or_report("leaks", lambda: leak_census(worker))  # who holds the memory: the leak finder's top owners
    worker._pause("memory limit")
