"""What a quit does when the training thread does not stop: never hang, never leave children behind.

A quit (a command, a key, a signal, a dropped SSH link) asks the training thread to stop after
its step. A step stuck forever (a hung DataLoader worker, a deadlock, C code that never returns)
would keep the process alive for good. `QuitEscalation` runs on a thread of its own, never the
training thread: it interrupts the step, then ends the child processes and the process. A
snapshot or a rebuild in progress (`worker.activity`) is our own work on the trained state:
it is waited for, never cut short. Both front ends use it: headless and the app.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from workbench.engine.forked_children import begin_ending_children

from workbench.protocol.events import Error, Exit
from workbench.engine.session import Session

STUCK_EXIT_CODE = 1
STUCK_REASON = "stuck"


@dataclass(frozen=True)
class QuitTimeouts:
    """How long a quit (the command, or a signal) waits for the training thread, stage by stage.

    `step`: a step still running this long after the quit is interrupted (or 3x the slowest
    recent step, if that is longer: a slow step is not a stuck one). `interrupted`: if the
    thread is still stuck this much later (a step in C code, waiting on a hung process), the
    child processes are ended and the process exits. `children`: a child gets this long after
    SIGTERM before SIGKILL. `exit_event`: how long a forced exit waits for its `exit` line.
    """

    step: float = 10.0
    interrupted: float = 5.0
    children: float = 3.0
    exit_event: float = 2.0


QUIT_TIMEOUTS = QuitTimeouts()  # the app's; headless has its own copy (workbench.frontends.headless.QUIT_TIMEOUTS): test drivers lower them


class QuitEscalation(threading.Thread):
    """After a quit: interrupt a step that will not end, then end the child processes and the process.

    Runs on its own thread, never the training thread, and never waits for the front end
    (a forced exit waits `exit_event` seconds at most for its `exit` line to be written).
    `begin` only stores a time: it is safe from a signal handler and from the stdin thread.
    """

    def __init__(
        self,
        session: Session,
        timeouts: QuitTimeouts,
        exit_written: Callable[[float], object],
        say: Callable[[str], None] | None = None,
    ) -> None:
        """`exit_written(timeout)` waits until the front end wrote the `exit` event; `say` also tells a user
        whose front end is gone (the app after it left the screen) what is happening."""
        super().__init__(name="vram-bench-quit", daemon=True)
        self.session = session
        self.timeouts = timeouts
        self.exit_written = exit_written
        self.say = say
        self.quit_at: float | None = None
        self._since: float | None = None  # when the current stage's wait began
        self._interrupted = False
        self._stopped = False

    def begin(self) -> None:
        if self.quit_at is None:
            self._since = self.quit_at = time.monotonic()

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        while not self._stopped:
            # Before a quit, once a second: each wakeup takes the GIL from the training thread (eventbus.py).
            time.sleep(0.25 if self._since is not None else 1.0)
            if self._since is not None and not self._stopped:
                self._check(time.monotonic())

    def _check(self, now: float) -> None:
        worker = self.session.worker
        since = self._since or now
        if not worker.is_alive():
            return
        if worker.activity is not None:  # a snapshot or a rebuild: our own work on the trained state, not a stuck step
            self._since = now
            return
        if not self._interrupted:
            if now - since >= self._step_grace():
                self._interrupted, self._since = True, now
                running = worker.interrupt()  # lands at the step's next Python bytecode, not inside C code
                where = "its step was interrupted" if running else "it is not in a step (setup?), so nothing could be interrupted"
                self._tell(
                    f"training did not stop within {now - since:.0f} s of the quit: {where}. If it is still "
                    f"stuck in {self.timeouts.interrupted:.0f} s, its child processes are ended and vram-bench exits."
                )
        elif now - since >= self.timeouts.interrupted:
            self._force_exit(now)

    def _tell(self, message: str) -> None:
        self.session.bus.publish(Error(where="quit", message=message))
        if self.say is not None:
            self.say(f"vram-bench: {message}")

    def _step_grace(self) -> float:
        recent = list(self.session.worker.step_ms_history)
        return max(self.timeouts.step, 3 * max(recent, default=0.0) / 1000)

    def _force_exit(self, now: float) -> None:
        session = self.session
        children = psutil.Process().children(recursive=True)
        self._tell(
            f"the training thread is still stuck {now - (self.quit_at or now):.0f} s after the quit "
            f"(a step blocked in C code or waiting on a hung process); ending {len(children)} child process(es) "
            f"and exiting with code {STUCK_EXIT_CODE}. Nothing was saved since the last snapshot."
        )
        end_child_processes(self.timeouts.children)
        session.bus.publish(Exit(reason=STUCK_REASON, step=session.worker.step, code=STUCK_EXIT_CODE))
        self.exit_written(self.timeouts.exit_event)
        os._exit(STUCK_EXIT_CODE)


def end_child_processes(timeout: float) -> list[int]:
    """Terminate this process's child processes (and theirs), kill what is left after `timeout` s; their pids."""
    begin_ending_children()  # forked children stop ignoring SIGTERM (forked_children.py)
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    return [child.pid for child in children]
