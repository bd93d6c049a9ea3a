"""Headless front end: JSON-lines events on stdout, one command per line on stdin.

This is also the scripting and test interface. The real stdout carries only
events; whatever the user's code prints becomes `print` events, and prints
from other threads go to stderr.

Stdin is read as bytes from file descriptor 0 (workbench/protocol/lines.py says why);
`sys.stdin` is /dev/null while the session runs, so nothing reads it through its buffer.
A quit that the training thread does not honour escalates (`QuitTimeouts`), and no
path out of here leaves child processes (DataLoader workers) behind.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO


from workbench.protocol.eventbus import ROUTINE, write_until_exit
from workbench.protocol.events import CommandError, Error, Event, Exit, Interrupt, Quit, parse_command
from workbench.engine.commands.run_control import InputClosed
from workbench.engine.forked_children import keep_data_loader_workers
from workbench.engine.quit_escalation import QuitEscalation, QuitTimeouts, end_child_processes
from workbench.engine.session import Session
from workbench.protocol.lines import read_lines

QUIT_TIMEOUTS = QuitTimeouts()  # read when a session starts: a test driver may lower it
# Steps and memory samples are printed in batches at most this far apart (anything else at once): one wakeup per step
# would take the GIL from the training thread at every step (workbench/protocol/eventbus.py).
STEP_BATCH_SECONDS = 0.25  # as the socket sends them; 50 ms cost rank 0 three times the CPU (bench/RESULTS.md)


def _read_commands(session: Session, fd: int, on_quit: Callable[[], None]) -> None:
    """Stdin reader thread. End of input is not a quit: scripts may close stdin and let it run.

    But with nobody left to send `resume`, a pause would wait forever: the pause the run is in, or
    any pause from then on, ends it (exit code 1 for an error, unless a saved fix comes first; a
    final snapshot and code 0 for the user's pause or the data's end).
    """
    for line in read_lines(fd):
        if line.problem is not None:
            session.bus.publish(Error(where="command", message=line.problem))
            continue
        if not line.text.strip():
            continue
        try:
            command = parse_command(line.text)
        except CommandError as exc:
            session.bus.publish(Error(where="command", message=str(exc)))
            continue
        session.send(command)
        if isinstance(command, Quit):
            on_quit()
    session.send(InputClosed())  # a pause from now on, or the one the run is in, ends it: nobody could resume


def _not_routine(event: Event) -> bool:
    return not isinstance(event, ROUTINE)


def run_headless(
    session: Session,
    stdout: TextIO,
    stdin: TextIO | None,
    timeouts: QuitTimeouts | None = None,
    *,
    flush: Callable[[float], object] | None = None,
    telemetry: bool = True,
) -> int:
    """Run until the session exits (quit, --max-steps, setup failure); returns the exit code.

    `flush(timeout)`: what else must have sent the `exit` event before a forced exit (a session's socket clients).
    `telemetry=False`: `stdout` discards what it is given (a session process, a rank > 0), so steps, memory samples
    and rank summaries are not queued for it at all: no wakeups beside the training loop for nothing."""
    events = session.bus.subscribe(maxlen=1_000_000, accept=None if telemetry else _not_routine)
    exit_written = threading.Event()

    def all_written(timeout: float) -> None:
        _all_written(session, exit_written, timeout)
        if flush is not None:
            flush(timeout)

    escalation = QuitEscalation(session, timeouts or QUIT_TIMEOUTS, all_written)
    previous_handlers, keep_loader_workers_undone = _quit_on_signals(session, escalation)
    fd = _fileno(stdin)
    quiet_stdin = _silence_sys_stdin(stdin) if fd is not None else None
    try:
        session.start()
        escalation.start()
        if fd is not None:
            threading.Thread(
                target=_read_commands, args=(session, fd, escalation.begin), name="vram-bench-stdin", daemon=True
            ).start()
        out = stdout
        unwritten = _Unwritten()
        while True:
            batch = events.wait(timeout=0.2, linger=STEP_BATCH_SECONDS)
            try:
                if write_until_exit(batch, out):
                    break
                unwritten.written()
            except OSError as exc:
                if _reader_gone(exc) and out is stdout:
                    out = stdout = _Discard()  # the rest, the exit included, goes nowhere: nobody reads it
                    _quit_for_a_gone_reader(session, escalation)
                    continue
                if unwritten.failed(batch, exc):
                    break  # the exit was in it: the run ends as it would have, its stream cut short
        exit_written.set()  # a forced exit waits for this before ending the process
    finally:
        try:
            session.close()
            if not exit_written.is_set():  # left early (an exception): what was queued, still without the exit
                for event in events.drain():
                    if not isinstance(event, Exit):
                        stdout.write(event.to_json() + "\n")
            stdout.flush()
        except OSError as exc:  # stdout still cannot be written (a full disk): the run has ended all the same
            _say_on_stderr(f"vram-bench: the last events could not be written to stdout ({exc.strerror or exc})")
        finally:
            escalation.stop()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            keep_loader_workers_undone()
            if quiet_stdin is not None:
                sys.stdin, devnull = quiet_stdin
                devnull.close()
            end_child_processes(escalation.timeouts.children)  # DataLoader workers a state still holds, a step's subprocesses
    return session.exit_code


def _reader_gone(exc: OSError) -> bool:
    """Stdout's reader went away (`vram-bench run ... --headless | head`, a driver that died): EPIPE."""
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE


class _Unwritten:
    """Stdout that cannot be written while its reader is still there (redirected to a file on a full disk): the run
    trains on, and stderr says so once, and again with the count of events lost once a write succeeds. Before, the
    error went up through the session: the process ended with a traceback and the trained state was lost."""

    def __init__(self) -> None:
        self.lost = 0

    def failed(self, batch: list[Event], exc: OSError) -> bool:
        """A batch not written; True when the exit event was in it (the stream ends there all the same)."""
        if not self.lost:
            _say_on_stderr(f"vram-bench: cannot write events to stdout ({exc.strerror or exc}): training goes on, and "
                           "events are lost until a write succeeds (snapshots may fail too, each said)")
        self.lost += len(batch)
        return any(isinstance(event, Exit) for event in batch)

    def written(self) -> None:
        if self.lost:
            _say_on_stderr(f"vram-bench: stdout is written again; {self.lost} events were lost")
            self.lost = 0


def _say_on_stderr(text: str) -> None:
    """A line on stderr, which may be on the same full disk: then it is not said, and nothing else fails for it."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


class _Discard(io.StringIO):
    """Where events go once stdout's reader is gone: nowhere (the run's events.jsonl still has them all)."""

    def write(self, text: str) -> int:
        return len(text)


def _quit_for_a_gone_reader(session: Session, escalation: QuitEscalation) -> None:
    """As a dropped terminal's SIGHUP does: a final snapshot, then exit. Before, the first write after the reader left
    raised out of the session with a chain of tracebacks, exit code 1 and no snapshot: the trained state was lost."""
    print("vram-bench: stdout's reader is gone (broken pipe): writing a final snapshot, then exiting",
          file=sys.stderr, flush=True)
    session.request_quit(final_snapshot=True, reason="output closed")
    escalation.begin()


def _all_written(session: Session, exit_written: threading.Event, timeout: float) -> None:
    """Before a forced exit: the `exit` event printed, and in the run's events.jsonl (a session process has one)."""
    exit_written.wait(timeout)
    log = session.event_log
    if log is not None and log.is_alive():
        log.join(timeout)  # it ends once it has written the `exit` event


def _fileno(stdin: TextIO | None) -> int | None:
    if stdin is None:
        return None
    try:
        return stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # not backed by a descriptor: no commands, as with no stdin


def _silence_sys_stdin(stdin: TextIO | None) -> tuple[TextIO, TextIO] | None:
    """While commands are read from fd 0, `sys.stdin` is /dev/null: `input()` in a step cannot eat a command,
    and no thread holds stdin's buffer lock when the user's code forks. Returns what to restore."""
    if stdin is not sys.stdin:
        return None
    devnull = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - closed when the session ends
    sys.stdin = devnull
    return stdin, devnull


def _quit_on_signals(session: Session, escalation: QuitEscalation) -> tuple[dict[int, object], Callable[[], None]]:
    """SIGINT finishes the current step and exits; SIGTERM and SIGHUP (a dropped SSH link) write a final snapshot first;
    the requeue signal (SIGUSR1) too, then requeues the job if asked and exits 0.
    A DataLoader's worker forked by this process ignores SIGTERM and SIGHUP while this process lives (forked_children.py).

    The quit escalates like the `quit` command's (QuitTimeouts). A second signal interrupts the step
    at once; a third ends the child processes and exits (code 130). A forked child (a DataLoader
    worker) inherits these handlers: there they do what the signal did before.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}, lambda: None
    previous: dict[int, object] = {}
    received = {"count": 0}
    owner = os.getpid()

    def handle(signum: int, frame: object, final_snapshot: bool) -> None:
        if os.getpid() != owner:
            _as_before(signum, frame, previous[signum])
            return
        received["count"] += 1
        if received["count"] == 1:
            session.worker.stopping_on_signal = True  # a launcher's or a terminal's signal reaches DataLoader workers too
            session.request_quit(final_snapshot=final_snapshot, reason="requeue signal" if signum == requeue else "quit")
            escalation.begin()
            if session.worker.step_started is not None:
                session.bus.publish(Error(where="stopping", message="stopping after the current step; signal again to interrupt it"))
        elif received["count"] == 2:
            session.send(Interrupt())  # a hung step: raise KeyboardInterrupt in it, then quit as asked
        else:
            end_child_processes(1.0)
            os._exit(130)  # a step stuck in C code: the user insists

    requeue = getattr(signal, f"SIG{session.config.requeue_signal}")  # a batch scheduler's "time is nearly up"
    handlers = {signal.SIGINT: False, signal.SIGTERM: True, signal.SIGHUP: True, requeue: True}
    put_back = keep_data_loader_workers(owner)  # their own SIGTERM handler would die of a group-wide stop signal
    for sig, final_snapshot in handlers.items():
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, lambda signum, frame, snap=final_snapshot: handle(signum, frame, snap))
    return previous, put_back


def _as_before(signum: int, frame: object, before: object) -> None:
    """In a forked child: put the handler vram-bench replaced back, and let it (or the default) act."""
    if before is None:  # set from C: unknown to Python, so the default
        before = signal.SIG_DFL
    signal.signal(signum, before)  # type: ignore[arg-type]
    if callable(before):
        before(signum, frame)
    elif before == signal.SIG_DFL:
        os.kill(os.getpid(), signum)
