"""An error that leaves a generator ends it: said when the step fails, and again when its end is met.

A script's epochs become a generator that `step()` reads with `next()` (`for epoch in ...: for batch in ...:
yield batch`), and what runs between epochs (an `evaluate()` over the validation set, a checkpoint) runs inside
it. An exception raised there goes up through the generator's frame, and a generator that an exception leaves is
finished for good. The step pauses; the user saves a fix; the session resumes, and the next `next()` raises
StopIteration, which read as "the data ran out" (found porting pytorch/examples' word_language_model, whose
epoch-end evaluate() called a function a rename had removed). So the step's error names the generators it ended
and says that a fix alone meets their end and R makes them again; the StopIteration that follows says why they
have no more items.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from types import TracebackType

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


def ended_sentence(generators: list[str]) -> str:
    """Added to the failed step's message."""
    which = " and ".join(generators)
    return (f" The error went up through the generator {which}, and an exception that leaves a generator ends it: "
            "after a fix, reading it raises StopIteration. R (command `rebuild`) makes it again (setup() runs, the "
            "trained weights are carried over).")


def ended_by_error(generators: list[str], step: int, error: str) -> str:
    """Why the StopIteration that follows has no more items, when the step that failed before it ended a generator."""
    return f"step {step}'s {error} went up through the generator {' and '.join(generators)} and ended it"
