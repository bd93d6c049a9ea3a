"""Tracebacks through code a save replaced show that code's own lines, not today's file at its line numbers.

A save gives every function its new code, but a frame that was already running keeps the code it started with:
a generator of epochs made before the save (its note says it keeps the old code until it is made again). When an
error then goes up through it, Python's traceback shows the *file's* line at the old code's line number, which
after any edit above it is another line: found porting pytorch/examples' word_language_model, where the epochs
generator's frame read `yield batch, i` while it was running `val_loss = evaluate(val_data)` two lines lower.
The reloader's history keeps each replaced code object with the source it was compiled from, so the formatter
shows the line from that source and says the frame runs code from before a save.
"""

from __future__ import annotations

import traceback
import types
from collections.abc import Iterable

from workbench.engine.hotswap.patches import ReplaceCode, ShiftLines
from workbench.engine.hotswap.reloader import AppliedVersion


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


def true_stack(exc: BaseException, history: Iterable[AppliedVersion]) -> traceback.TracebackException:
    """`TracebackException.from_exception(exc)`, its frames that ran replaced code shown with their own lines."""
    formatted = traceback.TracebackException.from_exception(exc)
    replaced = replaced_code(history)
    if not replaced:
        return formatted
    frames: list[types.FrameType] = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if len(frames) != len(formatted.stack):
        return formatted  # not expected; the plain traceback rather than a misaligned one
    entries = list(formatted.stack)
    for i, (frame, entry) in enumerate(zip(frames, entries)):
        known = replaced.get(id(frame.f_code))
        if known is None or known[0] is not frame.f_code or entry.lineno is None:
            continue
        _, source, version = known
        lines = source.splitlines()
        line = lines[entry.lineno - 1].strip() if 0 < entry.lineno <= len(lines) else ""
        entries[i] = traceback.FrameSummary(
            entry.filename,
            entry.lineno,
            f"{entry.name} (running the code from before version {version}: this line is from that code, not the file)",
            lookup_line=False,
            line=line,
        )
    formatted.stack = traceback.StackSummary.from_list(entries)
    return formatted
