"""A step that raised StopIteration: the data ran out, said as such rather than as a failure with an empty message.

A plain loop ends when its data does (`for epoch in range(EPOCHS): for batch in loader`); a `step()` that reads such a
generator with `next()` meets StopIteration instead, with no message of its own. It is the run's natural end, or a
bug that ended the data early: either way the session pauses with the model kept and says what ran out and how to go
on. PEP 479 turns a StopIteration inside a generator into RuntimeError, so one that reaches the step's caller comes
from a `next()` (or `__next__`) on an iterator with nothing left.
"""

from __future__ import annotations

import linecache


def data_ran_out_message(step: int, file: str | None, line: int | None, path: str | None, ended_by: str | None = None) -> str:
    """The pause's message: which line read past the end (`path`: its file on disk, for the line's text), what it
    means, and the ways on. `step`: the last whole step. `ended_by`: why the iterator has nothing left when it is
    not its data's end (generator_end.py: an earlier step's error ended the generator)."""
    where = ""
    if file is not None and line is not None:
        text = linecache.getline(path, line).strip() if path else ""
        where = f" at {file}:{line}" + (f" (`{text}`)" if text else "")
    if ended_by is not None:
        lead = (f"the iterator ended in step {step + 1}: StopIteration{where}, not because its data ran out: "
                f"{ended_by}")
    else:
        lead = (f"the data ran out in step {step + 1}: StopIteration{where}, so the iterator that line reads has no "
                "more items (a generator that finished, such as one whose epochs are done, or a DataLoader iterator "
                "at its end)")
    return (f"{lead}. The model and optimizer hold step {step}, the last whole one. To train on, rebuild (R, command "
            "`rebuild`: setup() makes a new iterator, the trained weights are carried over, training resumes); or "
            "snapshot (s) and quit. A save alone does not resume: the iterator stays exhausted.")
