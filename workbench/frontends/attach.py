"""The app attached to a session process: what `vram-bench run`, `vram-bench` and `vram-bench attach` open.

Connects first (the hello carries the whole history, so the first frame is complete),
then runs the Textual app on a RemoteSession. Leaving the app leaves the session training,
unless the user chose to stop it there; a session that died is said on the way out too.
"""

from __future__ import annotations

import sys

from workbench.errors import UserError
from workbench.protocol import registry
from workbench.protocol.client import SessionGone
from workbench.protocol.remote import RemoteSession
from workbench.protocol.wire import WireError


def attach_app(entry: registry.SessionEntry, *, theme: str | None = None, mouse: bool = True,
               settings: dict | None = None) -> int:
    """Run the app on the session until the user leaves; the exit code (the session's, if it ended)."""
    from rich.console import Console

    from workbench.frontends.tui.app import make_app
    from workbench.frontends.tui.settings import tui_settings

    if settings is None:
        settings = tui_settings(theme)
    remote = RemoteSession(entry)
    try:
        remote.connect()
    except (SessionGone, WireError) as exc:
        raise UserError(f"cannot attach to session {entry.name}: {exc}", hint="vram-bench ls shows what runs.") from None
    app = make_app(remote, **settings)
    app.error_console = Console(file=sys.__stderr__, markup=False, highlight=False)
    try:
        app.run(mouse=mouse)
    finally:
        remote.close()
    if remote.ended is not None:
        _say(f"vram-bench: {remote.ended}")
        final = remote.final_snapshot
        snapshot = remote.status().last_snapshot
        if final is not None:
            _say(f"vram-bench: final snapshot of step {final.step} written to {final.path}")
        elif snapshot and "snapshot" not in remote.ended:
            _say(f"vram-bench: its last snapshot: {snapshot}")
        return remote.exit_code or 0
    _say(f"vram-bench: detached; session {entry.name} trains on (pid {remote.facts.get('pid', '?')}). "
        f"Back: vram-bench attach {entry.name}   End: vram-bench stop {entry.name}")
    return app.return_code or 0


def _say(message: str) -> None:
    try:
        print(message, file=sys.__stderr__, flush=True)
    except (OSError, ValueError, AttributeError):
        pass  # the terminal is gone (a dropped SSH link)
