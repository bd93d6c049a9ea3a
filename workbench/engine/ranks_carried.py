"""Under torchrun: what each rank's rebuild carried, so rank 0's `rebuild` event never speaks for a rank that did
otherwise.

Every rank runs `setup()` again and carries its own state over (sharded state stays sharded). Each decides on its
own what is carried: which tensors, which optimizer states, whether an LR schedule goes on or starts over. Rank 0
publishes the event, with its own counts and notes. Where another rank carried other counts (a scheduler made
otherwise on that rank alone, a pipeline stage with other layers), its counts and its own notes are added to the event
rather than left unsaid.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

MAX_NOTES = 3  # of a differing rank's own notes, the first few
MAX_NOTE_CHARS = 400

COUNTS = {  # the summary's field -> how the note names it
    "tensors": "tensors carried",
    "shared": "tensors shared",
    "optimizer_states": "optimizer states carried",
    "schedulers": "LR schedules carried",
    "new": "new",
    "mismatched": "of another shape",
    "dropped": "dropped",
}


def carried_summary(tensors: int, shared: int, optimizer_states: int, schedulers: int, new: Sized,
                    mismatched: Sized, dropped: Sized, notes: list[str]) -> dict[str, Any]:
    """This rank's rebuild, as JSON for the other ranks: its counts, and its notes to explain a difference."""
    return {"tensors": tensors, "shared": shared, "optimizer_states": optimizer_states, "schedulers": schedulers,
            "new": len(new), "mismatched": len(mismatched), "dropped": len(dropped), "notes": notes}


def differing_ranks_notes(summaries: list[dict[str, Any] | None]) -> list[str]:
    """Rank 0's notes for every rank whose counts are not rank 0's: what it carried, and its notes rank 0 has not."""
    if not summaries or summaries[0] is None:
        return []
    mine = summaries[0]
    out = []
    for rank, theirs in enumerate(summaries[1:], start=1):
        if theirs is None:
            out.append(f"rank {rank} did not say what its rebuild carried")
            continue
        differing = [key for key in COUNTS if theirs.get(key) != mine.get(key)]
        if not differing:
            continue
        counts = ", ".join(f"{theirs.get(key)} {COUNTS[key]} (rank 0: {mine.get(key)})" for key in differing)
        own = [note for note in theirs.get("notes", []) if note not in mine.get("notes", [])]
        said = "; its own notes: " + " | ".join(_brief(note) for note in own[:MAX_NOTES]) if own else ""
        more = f" (and {len(own) - MAX_NOTES} more in its event log)" if len(own) > MAX_NOTES else ""
        out.append(f"rank {rank} carried otherwise than rank 0: {counts}{said}{more}")
    return out


def _brief(note: str) -> str:
    return note if len(note) <= MAX_NOTE_CHARS else note[: MAX_NOTE_CHARS - 3] + "..."
