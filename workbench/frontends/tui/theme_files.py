"""Themes as data: TOML files in the shipped `themes/` folder and in the user's config dir.

A file is a flat table of Textual theme fields (name, dark, primary, ...,
optional `[variables]`). Bundled themes load first; a user file with the same
name replaces the bundled one. A bad file is skipped with a sentence saying why,
never a crash.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

from workbench.config import tomllib, user_themes_dir

DEFAULT_THEME = "vram-dark"
ANSI_THEME = "vram-ansi"

_COLOUR_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground", "background", "surface", "panel", "boost")
_FIELDS = frozenset(inspect.signature(Theme).parameters)


class ThemeFileError(ValueError):
    """A theme file that cannot be used; the message names the file and the fix."""


@dataclass
class ThemeCatalog:
    themes: dict[str, Theme] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def bundled_themes_dir() -> Path:
    """`themes/` of a checkout, or the copy packed into the wheel."""
    checkout = Path(__file__).resolve().parents[3] / "themes"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[2] / "_themes"


def load_theme_file(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeFileError(f"{path}: cannot read it ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ThemeFileError(f"{path}: not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ThemeFileError(f"{path}: unknown field(s) {', '.join(unknown)}; theme fields are {', '.join(sorted(_FIELDS))}")
    if not isinstance(data.get("name"), str) or not isinstance(data.get("primary"), str):
        raise ThemeFileError(f'{path}: a theme needs at least name = "..." and primary = "#rrggbb"')
    for key in _COLOUR_FIELDS:
        if key in data:
            _check_colour(path, key, data[key])
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{path}: [variables] must be a table of name = \"colour\" lines")
    for key, value in variables.items():
        if not isinstance(value, str):
            raise ThemeFileError(f"{path}: variable {key} must be a string")
    try:
        return Theme(**data)
    except TypeError as exc:
        raise ThemeFileError(f"{path}: {exc}") from exc


def _check_colour(path: Path, key: str, value: object) -> None:
    if not isinstance(value, str):
        raise ThemeFileError(f"{path}: {key} must be a colour string such as \"#5AA9E6\" or \"ansi_blue\"")
    try:
        Color.parse(value)
    except ColorParseError as exc:
        raise ThemeFileError(f"{path}: {key} = {value!r} is not a colour ({exc})") from exc


def load_catalog(folders: list[Path] | None = None) -> ThemeCatalog:
    """Every theme in the bundled folder, then the user's (later folders win on equal names)."""
    catalog = ThemeCatalog()
    for folder in folders if folders is not None else [bundled_themes_dir(), user_themes_dir()]:
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            try:
                theme = load_theme_file(path)
            except ThemeFileError as exc:
                catalog.problems.append(f"theme skipped: {exc}")
                continue
            catalog.themes[theme.name] = theme
    return catalog


def terminal_default_theme(environ: os._Environ[str] | dict[str, str] | None = None) -> str:
    """The theme to start with when the user chose none.

    Textual (through Rich) draws with 16 colours unless COLORTERM says truecolor or
    TERM says 256 colours; a truecolor theme squeezed into 16 colours looks wrong,
    so such terminals (plain TERM=xterm over SSH) start with the ANSI theme.
    """
    env = os.environ if environ is None else environ
    colorterm, term = env.get("COLORTERM", "").lower(), env.get("TERM", "")
    if not term or colorterm in ("truecolor", "24bit") or "256" in term:
        return DEFAULT_THEME
    return ANSI_THEME
