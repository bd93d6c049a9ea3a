"""Render a Rich renderable (a Table) once, at a known width, into plain styled Text.

Textual measures and re-renders a Static's Rich renderable many times while laying
out a screen (hundreds of times for the help screen's tables); a Text of
pre-wrapped lines is cheap to lay out and draw, so a screen opens at once.
"""

from __future__ import annotations

import io

from rich.console import Console, RenderableType
from rich.segment import Segment
from rich.text import Text


def as_text(renderable: RenderableType, width: int) -> Text:
    console = Console(width=max(width, 20), file=io.StringIO(), force_terminal=True, color_system="truecolor")
    text = Text(no_wrap=True, overflow="crop")
    lines = Segment.split_lines(console.render(renderable, console.options))
    for i, line in enumerate(lines):
        if i:
            text.append("\n")
        for segment in line:
            if not segment.control:
                text.append(segment.text, segment.style)
    text.rstrip()
    return text
