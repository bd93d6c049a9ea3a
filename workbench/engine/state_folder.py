"""The project's state folder, where each session's run folder goes (`runs.py`).

`<project>/.vram-bench/` when it can be; a project folder the user may read but
not write (a shared checkout, a read-only mount) still runs, with its artifacts
in the user's state folder, and the session says so once. A `.vram-bench` that
is a file is the user's to move: one clear error before anything starts.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from workbench.errors import UserError

FOLDER_NAME = ".vram-bench"


def choose_state_folder(project_root: Path) -> tuple[Path, str | None]:
    """The folder, created, and a sentence for the log when it is not the project's own."""
    folder = project_root / FOLDER_NAME
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"{folder} is a file, but vram-bench keeps the project's snapshots and logs in a folder of that name.",
            hint="Move or rename that file, then run again.",
        )
    try:
        folder.mkdir(exist_ok=True)
        if _can_write_in(folder):
            return folder, None
    except OSError:
        pass
    fallback = user_state_folder(project_root)
    try:
        fallback.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot write in {project_root} nor in {fallback} ({exc.strerror}).",
            hint="Run from a copy of the project you can write to.",
        ) from None
    return fallback, f"{project_root} is not writable: snapshots, traces and the event log go to {fallback}"


def user_state_folder(project_root: Path) -> Path:
    """A per-project folder under $XDG_STATE_HOME (or ~/.local/state), stable across runs."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(str(project_root.resolve()).encode()).hexdigest()[:10]
    return base / "vram-bench" / "projects" / f"{project_root.name}-{digest}"


def _can_write_in(folder: Path) -> bool:
    """Try it: permission bits lie (root, ACLs, read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False
