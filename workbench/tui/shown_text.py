"""Redraw a text widget only when its text changed, and re-lay out the screen only when its height may have.

Widgets redraw on timers (2-4 Hz). `Static.update` re-lays out and repaints the
whole screen on every call, so a paused session that redraws identical text
still costs CPU and terminal bandwidth (over SSH, too). This keeps idle cheap.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class ShownText:
    """What a Static last showed."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._lines = -1

    def show(self, widget: Static, text: Text) -> bool:
        """Update `widget` with `text` unless it already shows it; True if it was updated."""
        key = (text.plain, tuple(text.spans), str(text.style), text.no_wrap, text.overflow)
        if key == self._key:
            return False
        lines = text.plain.split("\n")
        width = widget.size.width
        # A line that may wrap changes the height without changing the line count: re-lay out then too.
        may_wrap = not text.no_wrap and width > 0 and any(len(line) > width for line in lines)
        widget.update(text, layout=len(lines) != self._lines or may_wrap or self._key is None)
        self._key, self._lines = key, len(lines)
        return True

    def forget(self) -> None:
        """Draw next time whatever the text (after a resize or theme change)."""
        self._key = None
