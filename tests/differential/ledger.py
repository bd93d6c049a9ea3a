"""Which source of each file should be live, mirrored from the events a session published.

A fresh start runs what is on disk. After a rollback it must run what the
rollback says runs again: the source before the undone version, while the file
on disk keeps the newer code. To know that source the ledger keeps the same
history the engine keeps: every applied reload (held ones join it when a
rebuild commits them), folded the same way on rollback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workbench.protocol.events import Event, Rebuilt, Reload


@dataclass(frozen=True)
class Commit:
    file: str
    previous: str
    source: str
    changed: bool  # False: only line numbers moved (a rollback folds it into the one before)


@dataclass
class Ledger:
    """Per file: the text on disk, the text applied, the text held for a rebuild; the reference to compare with."""

    disk: dict[str, str]
    applied: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)
    history: list[Commit] = field(default_factory=list)
    reference: dict[str, str] = field(default_factory=dict)  # what a fresh start should equal
    rolled_back: bool = False  # a rollback made the reference differ from the disk

    def __post_init__(self) -> None:
        self.applied = dict(self.disk)
        self.reference = dict(self.disk)

    def saved(self, file: str, text: str) -> None:
        self.disk[file] = text
        self.reference[file] = text

    def reload(self, event: Reload) -> None:
        """A reload event for a save (not a rollback: see `rollback`)."""
        file = event.file
        if file not in self.disk or not event.ok:
            return
        if event.held or event.needs_rebuild:
            self.held[file] = self.disk[file]
            return
        self.history.append(Commit(file, self.applied[file], self.disk[file], bool(event.changed)))
        self.applied[file] = self.disk[file]
        self.reference[file] = self.disk[file]  # a rescan re-applies a rolled-back file from disk
        self.held.pop(file, None)

    def rebuilt(self, event: Rebuilt) -> None:
        if not event.ok:
            return
        for file, text in self.held.items():
            self.history.append(Commit(file, self.applied[file], text, True))
            self.applied[file] = text
            self.reference[file] = text  # a change held after a rollback: the rebuild runs the file again
        self.held.clear()

    def live_instead_of(self, file: str) -> dict[str, str]:
        """The reference with `file` as it is live: what must run after a save of it that cannot run."""
        return {**self.reference, file: self.applied[file]}

    def can_roll_back(self) -> bool:
        return any(c.changed for c in self.history)

    def rollback(self) -> Commit | None:
        """Undo like the engine: line-number-only commits fold into the changed one before them; with none
        changed, nothing is undone."""
        if not self.can_roll_back():
            return None
        while self.history and not self.history[-1].changed:
            self._undo(self.history.pop())
        undone = self.history.pop()
        self._undo(undone)
        self.held.pop(undone.file, None)
        return undone

    def _undo(self, commit: Commit) -> None:
        self.applied[commit.file] = commit.previous
        self.reference[commit.file] = commit.previous
        self.rolled_back = self.rolled_back or commit.previous != self.disk[commit.file]


# Notes that say a construct is now as a fresh start has it: naming it there reports no difference.
AFFIRMATIONS = (
    re.compile(r"as a fresh start would: it ran again too$"),  # a later override of a re-bound constant ran again
    re.compile(r"^ran lines? \d+: "),  # x ran statements
    re.compile(r"^ran first what the saves of \S+ had not re-run"),  # a rebuild ran the statements left for x
    re.compile(r"^ran again what \S+ builds at import, so the new code builds it too"),  # a rebuild's import builders
    re.compile(r"^updated \d+ live closure\(s\) made from the changed code$"),
)


def texts_of(events: list[Event]) -> list[str]:
    """What reload, rebuild and failed-reload events said: where a construct must be named to count as reported.
    Notes that only say something now runs as a fresh start would (AFFIRMATIONS) do not count."""
    out: list[str] = []
    for event in events:
        if isinstance(event, Reload):
            out.extend((*event.held, *event.needs_rebuild, *(n for n in event.notes if not _affirms(n))))
            if not event.ok and event.error:
                out.append(event.error)
        elif isinstance(event, Rebuilt):
            out.extend(n for n in event.notes if not _affirms(n))  # optimizers setup() does not make
            if event.error:
                out.append(event.error)
    return out


def _affirms(note: str) -> bool:
    return any(p.search(note) for p in AFFIRMATIONS)
