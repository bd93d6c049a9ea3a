"""Where the training loop stands, shared by the loop and the command handlers.

Its own module so the handlers in `workbench/engine/commands/` can ask "is training running?"
without importing `workbench/engine/worker.py` (which imports them to register them).
"""

from __future__ import annotations

import enum


class RunState(str, enum.Enum):
    SETUP = "setup"
    RUNNING = "running"
    PAUSED = "paused"
    SETUP_FAILED = "setup failed"
    STOPPED = "stopped"


# Pauses that a successful reload ends on its own: the user saved a fix.
AUTO_RESUME_REASONS = frozenset({"error", "non-finite loss", "interrupted", "out of memory", "memory limit"})


def is_error_pause(reason: str) -> bool:
    """A pause a rank decided alone because its own step failed (every rank pauses with it under torchrun)."""
    return reason in AUTO_RESUME_REASONS and reason != "memory limit"
