"""An error that leaves a generator ends it: said when the step fails, and again when its end is met.

A script's epochs become a generator that `step()` reads with `next()` (`for epoch in ...: for batch in ...:
yield batch`), and what runs between epochs (an `evaluate()` over the validation set, a checkpoint) runs inside
it. An exception raised there goes up through the generator's frame, and a generator that an exception leaves is
finished for good. The step pauses; the user saves a fix; the session resumes, and the next `next()` raises
StopIteration, which read as "the data ran out" (found porting pytorch/examples' word_language_model, whose
epoch-end evaluate() called a function a rename had removed). So the step's error names the generators it ended.
One that setup()'s state holds leaves the state unable to train on as it is: the fix (or a resume) rebuilds first,
as for a dead process group under torchrun, so the session never resumes into a certain StopIteration. For one only a
module global holds (a rebuild does not make it again), the StopIteration that follows says why it has no more items.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from types import CodeType, GeneratorType, TracebackType
from typing import Any

from workbench.engine.state_walk import top_values

_GENERATOR = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def generators_ended(exc: BaseException, in_project: Callable[[str], str | None]) -> list[str]:
    """The project's generators the exception went through, outermost first: `epochs() (train.py:170)`.
    `in_project`: a file's path relative to the project, or None for a file outside it (a library's own
    generators, such as a `contextlib.contextmanager`, are not the user's iterators)."""
    found: list[str] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_flags & _GENERATOR:
            relative = in_project(os.path.abspath(code.co_filename))
            if relative is not None:
                found.append(f"{code.co_qualname}() ({relative}:{tb.tb_lineno})")
        tb = tb.tb_next
    return found


def ended_sentence(generators: list[str], in_state: bool) -> str:
    """Added to the failed step's message. `in_state`: one of them is in setup()'s state, which a rebuild makes
    again, so the fix (or a resume) rebuilds first."""
    which = " and ".join(generators)
    then = ("so saving a fix (or resuming) rebuilds first: setup() runs again and makes it anew, with the trained "
            "weights and optimizer state carried over (a stateful data loader goes on from its place)" if in_state else
            "after a fix, reading it raises StopIteration. A module statement made it at import, which R (command "
            "`rebuild`) does not run again: stop and start with --resume latest (the trained state goes on), or make "
            "it in setup(), which R runs again")
    return f" The error went up through the generator {which}, and an exception that leaves a generator ends it: {then}."


def ended_in_state(exc: BaseException, state: Any) -> list[str]:
    """The generators in setup()'s state that this exception ended (it went up through their frames, and they are
    closed now), by the label the user's code reaches them by: `state['batches']`. Reading one again can only raise
    StopIteration, and a rebuild makes it again; a generator a step makes and drops does not count."""
    codes: set[CodeType] = set()
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        codes.add(tb.tb_frame.f_code)
        tb = tb.tb_next
    return [label for label, value in top_values(state)
            if isinstance(value, GeneratorType) and value.gi_code in codes
            and inspect.getgeneratorstate(value) == inspect.GEN_CLOSED]


def ended_by_error(generators: list[str], step: int, error: str) -> str:
    """Why the StopIteration that follows has no more items, when the step that failed before it ended a generator."""
    return f"step {step}'s {error} went up through the generator {' and '.join(generators)} and ended it"
