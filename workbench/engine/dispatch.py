"""Commands to handlers: one table, one dispatch point.

Each command type has exactly one handler, registered with `@handles(...)` in its module
under `workbench/engine/commands/`. The training thread drains its queue and calls `dispatch` for
each command between two steps; nothing else calls a handler. That single call is where
"which client sent this" can be logged, and where ranks can agree on a batch of commands
before any of them runs (`for command in agree(batch): dispatch(worker, command)`).

Handlers are the training thread's own code, split by command: they act through the worker
they are given (its state, bus, reloader, and its underscored helpers such as `_pause` and
`_command_error`), which front ends must not touch. They import the worker's module only for
type checking, so `worker → commands → dispatch` has no cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from workbench.protocol.events import Command

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker

SETUP_NOT_FINISHED = "setup() has not finished"

C = TypeVar("C", bound=Command)
Run = Callable[["TrainingWorker", Any], None]


@dataclass(frozen=True)
class Handler:
    """What runs for one command type, and whether it needs the state setup() builds."""

    run: Run
    needs_state: bool = False
    refusal: str = ""  # said instead of running while setup() has not finished (needs_state only)


class UnknownCommand(LookupError):
    """A command type with no registered handler: a bug in the workbench, not in the user's code."""


HANDLERS: dict[type[Command], Handler] = {}


def handles(
    kind: type[C], *, needs_state: bool = False, missing: str = "", hint: str = ""
) -> Callable[[Callable[[TrainingWorker, C], None]], Callable[[TrainingWorker, C], None]]:
    """Register the decorated function as the one handler of `kind`.

    With `needs_state`, `dispatch` refuses the command until setup() has built the state, saying
    "{missing}: setup() has not finished" (and " ({hint})" when given) instead of running it.
    """
    if needs_state and not missing:
        raise ValueError(f"a handler of {kind.__name__} that needs the state must say what is missing without it")
    refusal = (f"{missing}: {SETUP_NOT_FINISHED}" + (f" ({hint})" if hint else "")) if needs_state else ""

    def register(fn: Callable[[TrainingWorker, C], None]) -> Callable[[TrainingWorker, C], None]:
        if kind in HANDLERS:
            raise ValueError(
                f"{kind.__name__} already has a handler ({_name(HANDLERS[kind].run)}); {_name(fn)} would be a second one"
            )
        HANDLERS[kind] = Handler(fn, needs_state, refusal)
        return fn

    return register


def dispatch(worker: TrainingWorker, command: Command) -> None:
    """Run `command`'s handler on the training thread (the only caller of handlers)."""
    handler = HANDLERS.get(type(command))
    if handler is None:
        raise UnknownCommand(
            f"no handler is registered for {type(command).__name__}; register one with "
            f"@handles({type(command).__name__}) in a module that workbench/engine/commands/__init__.py imports"
        )
    worker._settle_values()  # every step's loss is reported before a command acts (workbench/engine/step_values.py)
    if handler.needs_state and worker.user_state is None:
        worker._command_error(handler.refusal)
        return
    handler.run(worker, command)


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"
