"""The live side: a real Session on a project folder, driven one save, rebuild or rollback at a time.

The session starts paused and does not watch files (the script's arguments, if
any, in sys.argv while train.py is imported): a save is followed by the
`reload` command, a step by the `step` command, so every step runs exactly the
code the events so far describe. Waiting for "all reloads of this save are
done" uses a marker: after the rescan, the reload thread is asked about a file
that does not exist, and answers with a `no code changes` event for it; the
thread works in order, so every reload of the rescan came before it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.protocol.events import Error, Event, Rebuild, Rebuilt, ReloadNow, Rollback, RunStatements, Step, StepOnce
from workbench.engine.project import load_project, unload_project
from workbench.engine.session import Session, SessionConfig

TIMEOUT = 20.0


class LiveError(AssertionError):
    """The session did not answer as a session must (no event within the timeout, an exit)."""


@dataclass(frozen=True)
class StepResult:
    scalars: dict[str, float]
    error: str | None = None  # the step raised: what the live code did instead of returning values


def config() -> SessionConfig:
    """As tests/conftest.py's fast_config, but paused, unwatched, unsampled, without output capture."""
    return SessionConfig(
        device=torch.device("cpu"),
        start_paused=True,
        watch=False,
        sample_memory=False,
        memory_event_interval=0,
        capture_output=False,  # the projects print nothing; pytest's capture stays untouched
        freeze_gc=False,  # a collection per setup costs time and changes no code
    )


def write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class LiveProject:
    """A session on `folder`, which holds the project's files."""

    def __init__(self, folder: Path, files: dict[str, str], argv: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.argv = argv  # the script's arguments, as `vram-bench run train.py -- ARGS` passes them
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write(folder / name, text)
        self._pending: list[Event] = []
        self._markers = 0
        self.session: Session | None = None

    def __enter__(self) -> LiveProject:
        project = load_project(self.folder / "train.py", self.argv)
        try:
            self.session = Session(project, config())
        except BaseException:
            unload_project(project)
            raise
        self._events = self.session.bus.subscribe()
        self.session.start()
        self._until(lambda e: e.name == "paused", "the session to finish setup() and pause")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            self._events.close()
            self.session.close()

    # Actions ----------------------------------------------------------------------------
    def save(self, file: str, text: str) -> list[Event]:
        """Write the file, ask for a reload, return every event until all its reloads are published."""
        write(self.folder / file, text)
        assert self.session is not None
        self.session.send(ReloadNow())
        self._markers += 1
        marker = f".sync-{self._markers}.py"
        self.session.reload_service.files_changed({self.folder / marker}, time.monotonic())
        events = self._until(lambda e: e.name == "reload" and e.file == marker, "the reloads of a save")
        return events[:-1]

    def rebuild(self) -> list[Event]:
        assert self.session is not None
        self.session.send(Rebuild())
        return self._until(lambda e: isinstance(e, Rebuilt), "a rebuild event")

    def rollback(self) -> list[Event]:
        assert self.session is not None
        self.session.send(Rollback())
        return self._until(
            lambda e: (e.name == "reload") or (isinstance(e, Error) and e.where == "command"), "a rollback's answer"
        )

    def run_statements(self) -> list[Event]:
        """Key x: run the module statements a reload did not re-run. Answered by a reload event, a failure
        (an error from "reload"), or a command error when there is nothing to run."""
        assert self.session is not None
        self.session.send(RunStatements())
        return self._until(
            lambda e: e.name == "reload" or (isinstance(e, Error) and e.where in ("command", "reload")),
            "the answer to run-statements",
        )

    def step(self) -> tuple[StepResult, list[Event]]:
        assert self.session is not None
        self.session.send(StepOnce())
        events = self._until(
            lambda e: isinstance(e, Step) or (isinstance(e, Error) and e.where in ("step", "command")), "one step"
        )
        last = events[-1]
        if isinstance(last, Step):
            return StepResult(dict(last.scalars) | {"loss": last.loss}), events[:-1]
        assert isinstance(last, Error)
        return StepResult({}, error=last.message), events[:-1]

    # Events -----------------------------------------------------------------------------
    def _until(self, predicate: Callable[[Event], bool], what: str) -> list[Event]:
        """Events up to and including the first that matches."""
        deadline = time.monotonic() + TIMEOUT
        out: list[Event] = []
        while True:
            while self._pending:
                event = self._pending.pop(0)
                out.append(event)
                if predicate(event):
                    return out
                if event.name == "exit":
                    raise LiveError(f"waiting for {what}: the session exited; events: {[e.to_dict() for e in out]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LiveError(f"waiting for {what}: nothing within {TIMEOUT} s; events: {[e.to_dict() for e in out]}")
            self._pending.extend(self._events.wait(min(remaining, 0.5)))
