"""Colours by meaning (ok, warning, error...) taken from the current theme, as Rich styles.

Widgets draw Rich `Text`, which cannot read Textual's `$success` variables; this
turns a theme into plain style strings so every pane follows the theme, and the
ANSI theme keeps its 16 named colours (`ansi_green` -> `green`) instead of RGB.
"""

from __future__ import annotations

from dataclasses import dataclass
from textual.app import App
from textual.theme import Theme


@dataclass(frozen=True)
class Roles:
    ok: str
    warning: str
    error: str
    info: str  # headings, setup, snapshots
    accent: str  # profiling, the second data series
    secondary: str
    series: tuple[str, ...]  # chart lines, in order
    neutral: str = "bright_black"  # "other" memory, version markers
    muted: str = "dim"

    def bold(self, role: str) -> str:
        return f"bold {getattr(self, role)}"


def _rich_colour(colour: str | None, fallback: str) -> str:
    if not colour:
        return fallback
    if colour.startswith("ansi_"):
        name = colour[len("ansi_") :]
        return "default" if name == "default" else name
    return colour


def roles_for(theme: Theme) -> Roles:
    ok = _rich_colour(theme.success, "green")
    warning = _rich_colour(theme.warning, "yellow")
    error = _rich_colour(theme.error, "red")
    info = _rich_colour(theme.primary, "blue")
    accent = _rich_colour(theme.accent, "magenta")
    secondary = _rich_colour(theme.secondary, "cyan")
    return Roles(ok=ok, warning=warning, error=error, info=info, accent=accent, secondary=secondary, series=(info, accent, secondary, ok))


DEFAULT_ROLES = Roles(ok="green", warning="yellow", error="red", info="blue", accent="magenta", secondary="cyan",
                      series=("cyan", "magenta", "yellow", "green"))


def roles(app: App[object]) -> Roles:
    """The roles of the app's current theme."""
    return roles_for(app.current_theme)
