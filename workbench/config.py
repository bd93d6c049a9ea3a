"""The user's settings file: theme, key rebindings, log length.

`$XDG_CONFIG_HOME/vram-bench/config.toml` (default `~/.config/vram-bench/`).
A broken file never stops a session: what cannot be read is listed as a
problem for the app to show, and defaults are used. Persisting the theme edits
one line in place, so the user's comments and other settings survive.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

CONFIG_NAME = "config.toml"
DEFAULT_LOG_ENTRIES = 1000

EXAMPLE = """\
# vram-bench settings. Delete a line to get the default back.
# theme = "vram-dark"        # or vram-light, vram-high-contrast, vram-ansi, or a file in themes/ here
# log_entries = 1000         # how many entries the log pane keeps
# tensorboard = true         # write TensorBoard event files into each run folder (as --tensorboard)
#
# [keys]                     # rebind by action id (the help screen, ?, lists them)
# snapshot = "S"
# toggle_pause = "space,P"
"""


def config_dir() -> Path:
    """Where settings and user themes live (XDG config dir)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "vram-bench"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


@dataclass
class UserConfig:
    """Settings read from the file, plus what was wrong with it (sentences for the user)."""

    path: Path
    theme: str | None = None
    keys: dict[str, str] = field(default_factory=dict)
    log_entries: int = DEFAULT_LOG_ENTRIES
    tensorboard: bool = False
    problems: list[str] = field(default_factory=list)
    readable: bool = True  # False: the file exists but is not valid TOML; never overwrite it


def load_config(path: Path | None = None) -> UserConfig:
    path = path or config_dir() / CONFIG_NAME
    config = UserConfig(path=path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return config
    except (OSError, UnicodeDecodeError) as exc:
        config.readable = False
        config.problems.append(f"{path}: cannot read it ({exc}); using the defaults")
        return config
    except tomllib.TOMLDecodeError as exc:
        config.readable = False
        config.problems.append(f"{path}: not valid TOML: {exc}. Fix it or delete it; using the defaults")
        return config

    theme = data.pop("theme", None)
    if theme is not None and not isinstance(theme, str):
        config.problems.append(f"{path}: theme must be a name in quotes, e.g. theme = \"vram-dark\"")
    else:
        config.theme = theme
    entries = data.pop("log_entries", DEFAULT_LOG_ENTRIES)
    if isinstance(entries, int) and not isinstance(entries, bool) and entries > 0:
        config.log_entries = entries
    else:
        config.problems.append(f"{path}: log_entries must be a positive whole number, not {entries!r}")
    tensorboard = data.pop("tensorboard", False)
    if isinstance(tensorboard, bool):
        config.tensorboard = tensorboard
    else:
        config.problems.append(f"{path}: tensorboard must be true or false, not {tensorboard!r}")
    keys = data.pop("keys", {})
    if isinstance(keys, dict):
        config.keys = {str(k): v for k, v in keys.items()}
    else:
        config.problems.append(f"{path}: [keys] must be a table of action = \"key\" lines")
    for unknown in data:
        config.problems.append(f"{path}: unknown setting {unknown!r} (known: theme, log_entries, tensorboard, [keys])")
    return config


_THEME_LINE = re.compile(r"^theme\s*=.*$", re.M)
_FIRST_TABLE = re.compile(r"^\s*\[", re.M)


def save_theme(config: UserConfig, theme: str) -> None:
    """Remember the theme: replace the `theme = ...` line, or add one above the first table."""
    if not config.readable:
        raise OSError(f"{config.path} is not valid TOML, so it was left alone; fix it to keep the theme")
    line = f'theme = "{theme}"'
    try:
        text = config.path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = EXAMPLE
    if _THEME_LINE.search(text):
        text = _THEME_LINE.sub(line, text, count=1)
    elif table := _FIRST_TABLE.search(text):
        text = text[: table.start()] + line + "\n\n" + text[table.start() :]
    else:
        text = text + ("" if text.endswith("\n") or not text else "\n") + line + "\n"
    config.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = config.path.with_name(config.path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, config.path)
    config.theme = theme
