"""What the app starts with: the user's settings file, the themes, and the theme for this run.

Read before any UI (and before the model loads), so an unknown `--theme` is a one-line error.
"""

from __future__ import annotations

from typing import Any

from textual.theme import BUILTIN_THEMES

from workbench.config import load_config, user_themes_dir
from workbench.errors import UserError
from workbench.frontends.tui.theme_files import load_catalog, terminal_default_theme


def tui_settings(theme: str | None) -> dict[str, Any]:
    """The user's config file and themes, checked before any UI: an unknown --theme is a one-line error."""
    config = load_config()
    catalog = load_catalog()
    if theme is not None and theme not in catalog.themes and theme not in BUILTIN_THEMES:
        raise UserError(
            f"no theme named {theme!r}.",
            hint=f"Themes: {', '.join(sorted(catalog.themes))} (and Textual's: {', '.join(sorted(BUILTIN_THEMES))}). "
            f"Add your own as a .toml file in {user_themes_dir()}/.",
        )
    chosen = theme or config.theme or terminal_default_theme()
    return {"config": config, "theme": chosen, "themes": catalog.themes, "problems": catalog.problems + config.problems}
