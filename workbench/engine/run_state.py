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

# `step()` raised StopIteration: the iterator it reads has no more items (a generator whose epochs are done). A save
# cannot end this pause (the iterator stays exhausted); a rebuild can (setup() makes a new one), and resumes.
DATA_EXHAUSTED = "data exhausted"

# Pauses that end a headless run once its stdin is closed: nobody is left to resume them.
ENDS_RUN_WITHOUT_INPUT = AUTO_RESUME_REASONS | {DATA_EXHAUSTED}

# Pauses a rebuild ends: those a save ends, and the data's end (setup() makes a new iterator).
REBUILD_RESUMES = AUTO_RESUME_REASONS | {DATA_EXHAUSTED}


def is_error_pause(reason: str) -> bool:
    """A pause a rank decided alone from its own step's outcome (every rank pauses with it under torchrun)."""
    return (reason in AUTO_RESUME_REASONS and reason != "memory limit") or reason == DATA_EXHAUSTED
