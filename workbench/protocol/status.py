"""The status bar's facts: what the engine says its state is, as every front end reads it.

Stdlib only: the session fills it in-process (`Session.status()`), the socket sends it as
`{"wire": "status", ...}` frames when it changes, and a client rebuilds it with `from_wire`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SessionStatus:
    """A consistent-enough picture for a status bar, read without locks."""

    project: str
    device: str
    state: str
    pause_reason: str | None
    step: int
    steps_per_second: float
    code_version: int
    setup_elapsed: float
    setup_error: str | None
    profiling: bool
    last_step_ms: float | None
    needs_rebuild: tuple[str, ...] = ()  # files whose saved changes are held until a rebuild
    activity: str | None = None  # a long action between steps (a snapshot being written)
    unsaved_steps: int = 0
    memory_warning: str | None = None  # a memory trend toward the ceiling, while it lasts (memory_guard.py)
    clients: int = 0  # front ends attached over the session's socket (0 in-process)
    last_snapshot: str | None = None
    held: str | None = None  # under torchrun: what rank 0 waits for, while a rank holds the others up (whereabouts.py)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> SessionStatus:
        """From a status frame; unknown keys (a newer session) are ignored, missing optional ones defaulted."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        if "needs_rebuild" in fields:
            fields["needs_rebuild"] = tuple(fields["needs_rebuild"] or ())
        return cls(**fields)

    @classmethod
    def waiting(cls, project: str = "", device: str = "") -> SessionStatus:
        """Before a client has heard from its session."""
        return cls(project=project, device=device, state="connecting", pause_reason=None, step=0, steps_per_second=0.0,
                   code_version=0, setup_elapsed=0.0, setup_error=None, profiling=False, last_step_ms=None)
