"""A printed line as a terminal shows it: carriage returns and backspaces applied, not kept as characters.

Progress bars redraw one line: pytorch-cifar's `progress_bar` writes `\\r`, then backspaces, then the bar, and
flushes; tqdm writes `\\r` and the bar. A terminal overwrites the line; the log and the JSON stream had the control
characters themselves, which the app drew as garbage and a script had to clean. Other escape sequences (colours) are
left as they are.
"""

from __future__ import annotations


def as_a_terminal_shows(text: str) -> str:
    """`\\r` returns to the line's start and what follows overwrites it; `\\b` moves back one character."""
    if "\r" not in text and "\b" not in text:
        return text
    line: list[str] = []
    column = 0
    for char in text:
        if char == "\r":
            column = 0
        elif char == "\b":
            column = max(column - 1, 0)
        else:
            if column < len(line):
                line[column] = char
            else:
                line.append(char)
            column += 1
    return "".join(line)


def is_only_control(text: str) -> bool:
    """A write of nothing but carriage returns and backspaces: no line to show (a bar's last `\\r`)."""
    return bool(text) and not text.strip("\r\b")
