"""Which code a snapshot's run was running, kept in the snapshot, and what a resume says when its files differ.

A resume runs the project's files as they are on disk. The run that took the snapshot may not have been running
them: a rollback since a save, a save that was refused, or statements a save left for x kept it on other code than
its files held. Resumed, the weights go on under code they never trained with, and nothing said so: the resume
looked like the run going on. The snapshot now keeps, for each project file, a digest of the code that ran, a
digest of the file as it was on disk then, and the statements left for x; the resume compares them with the files
as they are now and says, in its notes, every file that runs other code than the snapshot's run did, and why.
Digests, not text: a snapshot must not become a copy of the project, and the note only needs to know "the same or
not".
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

KEY = "code"


class RunningCode(Protocol):
    """What the record reads of the reloader (hotswap/reloader.py)."""

    def tracked_files(self) -> list[Path]: ...
    def applied_source(self, path: Path) -> str | None: ...
    def read_source(self, path: Path) -> str | None: ...
    def statements_left_for_x(self, path: Path) -> list[str]: ...


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _on_disk(path: Path) -> str | None:
    try:
        return digest(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _digest_or_none(text: str | None) -> str | None:
    return None if text is None else digest(text)


def record(code: RunningCode, relative: Any) -> dict[str, dict[str, Any]]:
    """For each project file the session runs: {"ran": digest of its live code, "disk": digest of the file now (None
    when it cannot be read), "read": whether the reloader had read the file as it is (False: a save on its way, not
    planned yet), "left_for_x": the labels of statements the live code has not re-run}. `relative` names a path as
    the project does (`Project.relative`), so a resume in a copied folder finds the same files."""
    out: dict[str, dict[str, Any]] = {}
    for path in code.tracked_files():
        ran = code.applied_source(path)
        if ran is None:
            continue
        entry: dict[str, Any] = {"ran": digest(ran), "disk": _on_disk(path)}
        if entry["disk"] != entry["ran"]:
            entry["read"] = _digest_or_none(code.read_source(path)) == entry["disk"]
        left = code.statements_left_for_x(path)
        if left:
            entry["left_for_x"] = left
        out[relative(path)] = entry
    return out


def resume_notes(saved: Any, root: Path) -> tuple[str, ...]:
    """The resume's notes on the code: what runs now that the snapshot's run did not. Nothing for a snapshot written
    before this record existed (no claim either way) or one whose every file is as its run ran it."""
    if not isinstance(saved, dict):
        return ()
    apart, on_its_way, changed, gone, left = [], [], [], [], []
    for name, entry in sorted(saved.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("ran"), str):
            continue
        now = _on_disk(root / name)
        if now is None:
            gone.append(name)
        elif now != entry["ran"]:
            if now != entry.get("disk"):
                changed.append(name)
            else:
                (apart if entry.get("read", True) else on_its_way).append(name)
        elif entry.get("left_for_x"):
            left.append(f"{name} ({'; '.join(str(line) for line in entry['left_for_x'])})")
    notes = []
    if apart:
        one = len(apart) == 1
        notes.append(f"the snapshot's run was not running {_files(apart)} as {'it is' if one else 'they are'} on disk "
                     f"(a rollback since {'its' if one else 'their'} save, or a save that was refused): this run runs "
                     f"the file{'' if one else 's'}, code the snapshot's weights were not trained with; roll the "
                     f"file{'' if one else 's'} back by hand to train on as that run did")
    if on_its_way:
        one = len(on_its_way) == 1
        notes.append(f"the snapshot was taken as a save of {_files(on_its_way)} was on its way (read after it): its "
                     f"run had not run {'that file' if one else 'those files'} as {'it is' if one else 'they are'} "
                     "now, which this run runs")
    if changed:
        one = len(changed) == 1
        notes.append(f"{_files(changed)} changed since the snapshot was taken: this run runs "
                     f"{'it' if one else 'them'} as {'it is' if one else 'they are'} now, not the code the snapshot's "
                     "run ran")
    if gone:
        notes.append(f"{_files(gone)}, which the snapshot's run ran, cannot be read now")
    if left:
        notes.append("statements the snapshot's run had left for x (not re-run since their save) run now as the file "
                     f"has them: {', '.join(left)}")
    return tuple(notes)


def _files(names: list[str]) -> str:
    return ", ".join(names)
