"""Tracebacks that read well in a log pane: the user's frames first, then the error, then the rest in brief.

A training error usually surfaces deep inside torch; the line that matters is in
the project. The text traceback is parsed (it arrives as text in the `error`
event) into frames; frames under the project folder are shown with their code,
syntax-highlighted, and the library frames are listed one line each, dimmed.
Anything that does not parse is shown as ordinary highlighted traceback text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text

from workbench.frontends.tui.roles import DEFAULT_ROLES, Roles

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+))?$')
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
MAX_LIBRARY_FRAMES = 8


@dataclass
class Frame:
    file: str
    line: int
    function: str
    code: list[str] = field(default_factory=list)  # the source line, and Python's ^^^ markers if any


@dataclass
class ParsedTraceback:
    frames: list[Frame]
    error: list[str]  # "ValueError: ..." and any lines after it
    chained: int  # how many earlier exceptions were chained onto this one


def parse_traceback(text: str) -> ParsedTraceback | None:
    """The last exception of a (possibly chained) traceback; None if the text is not one."""
    lines = text.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    chained = sum(1 for line in lines if line.startswith(_CHAIN))
    frames: list[Frame] = []
    error: list[str] = []
    for line in lines[starts[-1] + 1 :]:
        if error:
            error.append(line)
        elif match := _FRAME.match(line):
            frames.append(Frame(match["file"], int(match["line"]), match["function"] or "<module>"))
        elif line.startswith("    ") and frames:
            frames[-1].code.append(line[4:])
        elif line.strip() and not line.startswith(" "):
            error.append(line)
    if not error:
        return None
    return ParsedTraceback(frames, error, chained)


def is_project_frame(path: str, root: Path) -> bool:
    """A file the user edits: under the project folder, not in an installed package or a hidden folder."""
    try:
        relative = Path(path).resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return not any(part.startswith(".") or part in ("site-packages", "dist-packages") for part in relative.parts)


def short_path(path: str, root: Path) -> str:
    """Project files relative to the project; installed files from their package folder on."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except (ValueError, OSError):
        pass
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def render_traceback(text: str, root: Path, *, roles: Roles = DEFAULT_ROLES, dark: bool = True) -> RenderableType:
    syntax_theme = "ansi_dark" if dark else "ansi_light"
    parsed = parse_traceback(text)
    if parsed is None:
        return Syntax(text.rstrip(), "pytb", theme=syntax_theme, word_wrap=True, background_color="default")
    mine = [f for f in parsed.frames if is_project_frame(f.file, root)]
    others = [f for f in parsed.frames if not is_project_frame(f.file, root)]
    parts: list[RenderableType] = []
    if mine:
        parts.append(Text("    your code (most recent call last):", style="dim"))
    for frame in mine:
        where = Text("      ")
        where.append(f"{short_path(frame.file, root)}:{frame.line}", style=roles.bold("info"))
        where.append(f" in {frame.function}")
        parts.append(where)
        if frame.code:
            parts.append(Syntax("\n".join(frame.code), "python", theme=syntax_theme, word_wrap=True,
                                background_color="default", code_width=None, padding=(0, 0, 0, 8)))
    for i, line in enumerate(parsed.error):
        parts.append(Text(f"    {line}", style=roles.bold("error") if i == 0 else roles.error))
    if others:
        parts.append(Text(f"    {len(others)} more frame(s) outside the project:", style="dim"))
        shown = others[-MAX_LIBRARY_FRAMES:]
        if len(others) > len(shown):
            parts.append(Text(f"      ... {len(others) - len(shown)} earlier frame(s)", style="dim"))
        for frame in shown:
            parts.append(Text(f"      {short_path(frame.file, root)}:{frame.line} in {frame.function}", style="dim"))
    if parsed.chained:
        parts.append(Text(f"    (while handling {parsed.chained} earlier exception(s); the full text is in the run folder's events.jsonl)",
                          style="dim"))
    return Group(*parts)
