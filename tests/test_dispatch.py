"""The command table: every command has one handler, refusals before setup() are said once, and the
one dispatch point says so when a command has no handler."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tests.conftest import is_event
from workbench.engine.dispatch import HANDLERS, UnknownCommand, dispatch, handles
from workbench.protocol.events import (
    Command,
    Evaluate,
    FindLeaks,
    Interrupt,
    Rebuild,
    ReloadNow,
    ShowBreakdown,
    TakeSnapshot,
)
from workbench.engine.memory_guard import MemoryLimitNear
from workbench.engine.worker import ApplyChanges  # registers every handler

# Session.send handles these itself, on the caller's thread: they never reach the training thread's queue.
ROUTED_BY_SESSION = {ReloadNow, Interrupt}

# The sentences said today when a command needs the state and setup() has not built it.
REFUSALS = {
    TakeSnapshot: "nothing to snapshot yet: setup() has not finished",
    ShowBreakdown: "no breakdown yet: setup() has not finished",
    FindLeaks: "no leak census yet: setup() has not finished",
    Evaluate: "nothing to evaluate yet: setup() has not finished",
    Rebuild: "nothing to rebuild: setup() has not finished (fix it and save to run it again)",
}


def workbench_commands() -> set[type[Command]]:
    """Every Command subclass the workbench defines (subclasses of subclasses too; not ones tests define)."""
    found: set[type[Command]] = set()
    pending = list(Command.__subclasses__())
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.__module__.startswith("workbench."):
            found.add(kind)
    return found


class StubWorker:
    """What `dispatch` itself reads: the state, and where a refusal goes."""

    def __init__(self) -> None:
        self.user_state = None
        self.refused: list[str] = []

    def _settle_values(self) -> None:
        """The last step's loss, read before any command acts (workbench/engine/step_values.py)."""

    def _command_error(self, message: str) -> None:
        self.refused.append(message)


def test_every_command_the_training_thread_receives_has_exactly_one_handler():
    commands = workbench_commands()
    assert {ApplyChanges, MemoryLimitNear} <= commands  # the internal ones are found too
    expected = commands - ROUTED_BY_SESSION
    missing = sorted(k.__name__ for k in expected - set(HANDLERS))
    extra = sorted(k.__name__ for k in set(HANDLERS) - expected)
    assert not missing, f"commands with no handler: {missing}"
    assert not extra, f"handlers for commands the training thread never receives: {extra}"


def test_a_second_handler_for_a_command_is_refused_at_registration():
    before = HANDLERS[TakeSnapshot]
    with pytest.raises(ValueError, match="TakeSnapshot already has a handler"):
        handles(TakeSnapshot)(lambda worker, command: None)
    assert HANDLERS[TakeSnapshot] is before


def test_commands_that_need_the_state_are_refused_with_todays_sentences_before_setup_finishes():
    assert {k for k, h in HANDLERS.items() if h.needs_state} == set(REFUSALS)
    for kind, sentence in REFUSALS.items():
        worker = StubWorker()
        dispatch(worker, kind())  # a handler that ran would fail on the stub: it has no bench, bus or reloader
        assert worker.refused == [sentence]


def test_an_unknown_command_is_a_clear_error_at_dispatch():
    @dataclass(frozen=True)
    class Unregistered(Command):
        word = "unregistered"

    for command in (Unregistered(), ReloadNow(), Interrupt()):
        with pytest.raises(UnknownCommand, match=f"no handler is registered for {type(command).__name__}"):
            dispatch(StubWorker(), command)


def test_a_session_whose_setup_failed_refuses_them_in_the_same_words(start_session):
    live = start_session({"train.py": "def setup(bench):\n    raise RuntimeError('broken')\n\n\ndef step(state, bench):\n    return 0.0\n"})
    live.wait_for(is_event("setup", status="failed"), timeout=30)
    for kind, sentence in REFUSALS.items():
        live.send(kind())
        live.wait_for(is_event("error", where="command", message=sentence))


def test_a_handler_acts_through_the_worker_it_is_given():
    worker = SimpleNamespace(user_state={"model": None}, seen=[])
    worker._settle_values = lambda: worker.seen.append("last step's values read")

    class Probe(Command):
        word = "probe"

    handles(Probe)(lambda w, command: w.seen.append(command))
    try:
        command = Probe()
        dispatch(worker, command)
        assert worker.seen == ["last step's values read", command]  # a command never acts before a step is reported
    finally:
        del HANDLERS[Probe]
