"""One handler per command, registered with `workbench.engine.dispatch.handles` when its module is imported.

Why here and not in `workbench/engine/actions/`: an action does one thing to the state or the device
(write a snapshot, run a profiler, trim the heap) and knows nothing of commands or the training
thread; a handler decides, for one command, what to refuse and which actions to run through the
worker. The loop imports this package (which imports every handler module) and calls
`workbench.engine.dispatch.dispatch`; nothing else calls a handler.
"""

from workbench.engine.commands import (
    evaluate,
    memory,
    memory_limit,
    profile,
    rebuild,
    reload,
    run_control,
    snapshot,
)
from workbench.engine.commands.reload import ApplyChanges

__all__ = [
    "ApplyChanges",
    "evaluate",
    "memory",
    "memory_limit",
    "profile",
    "rebuild",
    "reload",
    "run_control",
    "snapshot",
]
