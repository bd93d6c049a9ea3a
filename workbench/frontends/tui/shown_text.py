"""Redraw a text widget only when its text changed, and re-lay out the screen only when its height may have.

Widgets redraw on timers (2-4 Hz). `Static.update` re-lays out and repaints the
whole screen on every call, so a paused session that redraws identical text
still costs CPU and terminal bandwidth (over SSH, too). This keeps idle cheap.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static


class ShownText:
    """What a Static last showed."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._height = -1

    def show(self, widget: Static, text: Text) -> bool:
        """Update `widget` with `text` unless it already shows it; True if it was updated."""
        key = (text.plain, tuple(text.spans), str(text.style), text.no_wrap, text.overflow)
        if key == self._key:
            return False
        height = _height(text, widget.size.width)
        widget.update(text, layout=height != self._height or self._key is None)
        self._key, self._height = key, height
        return True

    def forget(self) -> None:
        """Draw next time whatever the text (after a resize or theme change)."""
        self._key = None


def _height(text: Text, width: int) -> int:
    """Rows the text takes at `width` (wrapped lines count once per row they fill)."""
    lines = text.plain.split("\n")
    if text.no_wrap or width <= 0:
        return len(lines)
    return sum(max(1, -(-cell_len(line) // width)) for line in lines)
