"""Headless front end: JSON-lines events on stdout, one command per line on stdin.

This is also the scripting and test interface. The real stdout carries only
events; whatever the user's code prints becomes `print` events, and prints
from other threads go to stderr.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import TextIO

from workbench.events import CommandError, Error, Exit, Interrupt, parse_command
from workbench.session import Session


def _read_commands(session: Session, stdin: TextIO) -> None:
    """Stdin reader thread. End of input is not a quit: scripts may close stdin and let it run.

    But with nobody left to send `resume`, a pause for an error would wait forever: from then
    on such a pause ends the run (exit code 1), unless a saved fix comes first.
    """
    for line in stdin:
        if not line.strip():
            continue
        try:
            session.send(parse_command(line))
        except CommandError as exc:
            session.bus.publish(Error(where="command", message=str(exc)))
    session.worker.exit_on_error_pause = True


def run_headless(session: Session, stdout: TextIO, stdin: TextIO | None) -> int:
    """Run until the session exits (quit, --max-steps, setup failure); returns the exit code."""
    events = session.bus.subscribe(maxlen=1_000_000)
    previous_handlers = _quit_on_signals(session)
    try:
        session.start()
        if stdin is not None:
            threading.Thread(target=_read_commands, args=(session, stdin), name="vram-bench-stdin", daemon=True).start()
        while True:
            done = False
            for event in events.wait(timeout=0.2):
                stdout.write(event.to_json() + "\n")
                done = done or isinstance(event, Exit)
            stdout.flush()
            if done:
                break
    finally:
        session.close()
        for event in events.drain():
            if not isinstance(event, Exit):
                stdout.write(event.to_json() + "\n")
        stdout.flush()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return session.exit_code


def _quit_on_signals(session: Session) -> dict[int, object]:
    """SIGINT finishes the current step and exits; SIGTERM and SIGHUP (a dropped SSH link) write a final snapshot first."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, object] = {}
    received = {"count": 0}

    def handle(signum: int, final_snapshot: bool) -> None:
        received["count"] += 1
        if received["count"] == 1:
            session.request_quit(final_snapshot=final_snapshot)
            if session.worker.step_started is not None:
                session.bus.publish(Error(where="command", message="stopping after the current step; signal again to interrupt it"))
        elif received["count"] == 2:
            session.send(Interrupt())  # a hung step: raise KeyboardInterrupt in it, then quit as asked
        else:
            os._exit(130)  # a step stuck in C code: the user insists

    handlers = {signal.SIGINT: False, signal.SIGTERM: True, signal.SIGHUP: True}
    for sig, final_snapshot in handlers.items():
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, lambda signum, _frame, snap=final_snapshot: handle(signum, snap))
    return previous
