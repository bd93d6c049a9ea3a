"""A sample README's guided tour, read as data, so the tour text and its test cannot drift apart.

A tour edit in a README is an HTML comment (invisible when rendered) followed by
two fenced code blocks: the text to find in the file, then what to replace it with.

    <!-- tour-edit: lr in train.py -->
    ```python
    LR = 3e-3
    ```
    ...any prose...
    ```python
    LR = 3e-4
    ```

The "find" text must occur exactly once in the file as it is at that point of the
tour, so a README that no longer matches its sample fails loudly. A test applies
each edit as a real save and checks the effect the README describes; `tour_edits`
returns them in README order, and a test asserts it checked every one by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_MARKER = re.compile(r"<!--\s*tour-edit:\s*(?P<name>[\w-]+)\s+in\s+(?P<file>[\w./-]+)\s*-->")
_FENCE = re.compile(r"^```[\w-]*\n(?P<body>.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class TourEdit:
    """One save the tour asks the user to make."""

    name: str
    file: str
    find: str
    replace: str

    def apply(self, project: Path) -> Path:
        """Make the edit in `project` and save it like an editor (write, flush, fsync). Returns the file."""
        path = project / self.file
        source = path.read_text(encoding="utf-8")
        count = source.count(self.find)
        if count != 1:
            raise AssertionError(f"tour edit {self.name!r}: {self.find!r} occurs {count} times in {self.file}, expected once")
        data = source.replace(self.find, self.replace, 1).encode("utf-8")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return path


def tour_edits(readme: Path) -> list[TourEdit]:
    """Every `tour-edit` in the README, in order. Each marker must be followed by two fenced blocks."""
    text = readme.read_text(encoding="utf-8")
    edits: list[TourEdit] = []
    for marker in _MARKER.finditer(text):
        blocks = list(_FENCE.finditer(text, marker.end()))[:2]
        if len(blocks) < 2:
            raise AssertionError(f"{readme.name}: tour edit {marker['name']!r} needs two fenced blocks after it")
        between = text[marker.end() : blocks[1].start()]
        if _MARKER.search(between):
            raise AssertionError(f"{readme.name}: tour edit {marker['name']!r} is followed by another marker before its second block")
        find, replace = (block["body"].rstrip("\n") for block in blocks)
        if not find.strip():
            raise AssertionError(f"{readme.name}: tour edit {marker['name']!r} has nothing to find (its first block is empty)")
        if find == replace:
            raise AssertionError(f"{readme.name}: tour edit {marker['name']!r} changes nothing (its two blocks are the same)")
        edits.append(TourEdit(marker["name"], marker["file"], find, replace))
    names = [edit.name for edit in edits]
    if len(set(names)) != len(names):
        raise AssertionError(f"{readme.name}: tour edit names repeat: {names}")
    return edits
