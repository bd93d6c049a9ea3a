"""Tracebacks show the lines of the code that runs, not today's file at its line numbers.

A save gives every function its new code, but a frame that was already running keeps the code it started with:
a generator of epochs made before the save (its note says it keeps the old code until it is made again). When an
error then goes up through it, Python's traceback shows the *file's* line at the old code's line number, which
after any edit above it is another line: found porting pytorch/examples' word_language_model, where the epochs
generator's frame read `yield batch, i` while it was running `val_loss = evaluate(val_data)` two lines lower.
The reloader's history keeps each replaced code object with the source it was compiled from, so the formatter
shows the line from that source and says the frame runs code from before a save. The same holds for all the code
of a file whose live source is not the file on disk: after a rollback (the file keeps the newer code), a save held
back for a rebuild, or one that did not parse, a traceback showed the file's new lines at the old code's numbers.
"""

from __future__ import annotations

import traceback
import types
from collections.abc import Callable, Iterable

from workbench.engine.hotswap.patches import ReplaceCode, ShiftLines
from workbench.engine.hotswap.reloader import AppliedVersion
from workbench.engine.hotswap.source_index import split_lines


def replaced_code(history: Iterable[AppliedVersion]) -> dict[int, tuple[types.CodeType, str, int]]:
    """id of each code object a kept version replaced -> (that code, the source it came from, the version that
    replaced it). Nested code (a generator's inner functions) is left out: frames of it are rare."""
    found: dict[int, tuple[types.CodeType, str, int]] = {}
    for version in history:
        for patch in version.patches:
            if isinstance(patch, ReplaceCode) and patch._saved:
                codes: list[types.CodeType] = [patch._saved[0]]
            elif isinstance(patch, ShiftLines):
                codes = list(patch._saved)
            else:
                continue
            for code in codes:
                found[id(code)] = (code, version.previous_source, version.version)
    return found


def true_stack(
    exc: BaseException, history: Iterable[AppliedVersion], live_source: Callable[[str], str | None] = lambda filename: None
) -> traceback.TracebackException:
    """`TracebackException.from_exception(exc)`, each frame shown with the line of the code it runs: a frame still
    running code a save replaced, with that code's line; a frame of a file whose live code is not what is on disk
    (a rollback, a save held back or that did not parse), with the live code's line (`live_source`: a project
    file's live source by its filename, or None)."""
    formatted = traceback.TracebackException.from_exception(exc)
    frames: list[types.FrameType] = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if len(frames) != len(formatted.stack):
        return formatted  # not expected; the plain traceback rather than a misaligned one
    replaced = replaced_code(history)
    entries = list(formatted.stack)
    for i, (frame, entry) in enumerate(zip(frames, entries)):
        if entry.lineno is None:
            continue
        known = replaced.get(id(frame.f_code))
        if known is not None and known[0] is frame.f_code:
            _, source, version = known
            why = f"running the code from before version {version}: this line is from that code, not the file"
        else:
            source = live_source(entry.filename)
            if source is None:
                continue
            why = "this line is from the code that runs: the file on disk has changed since"
        line = _line(source, entry.lineno)
        if line == (entry.line or "").strip():
            continue
        entries[i] = traceback.FrameSummary(entry.filename, entry.lineno, f"{entry.name} ({why})", lookup_line=False, line=line)
    formatted.stack = traceback.StackSummary.from_list(entries)
    return formatted


def _line(source: str, lineno: int) -> str:
    lines = split_lines(source)
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
