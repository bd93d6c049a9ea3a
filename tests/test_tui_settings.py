"""Themes, the settings file, the palette, rebinding keys, layouts, zoom, the log's length and tracebacks."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from textual.command import CommandPalette
from textual.widgets import OptionList

from tests.test_tui import TRAIN, log_text, session_factory, until, write_project  # noqa: F401 (fixture)
from workbench.cli import main
from workbench.config import DEFAULT_LOG_ENTRIES, load_config, save_theme
from workbench.frontends.tui.app import make_app
from workbench.frontends.tui.keys import ACTIONS, check_keymap, key_label
from workbench.frontends.tui.theme_files import ANSI_THEME, DEFAULT_THEME, load_catalog, load_theme_file, terminal_default_theme
from workbench.frontends.tui.traceback_view import render_traceback
from workbench.frontends.tui.widgets.loss_chart import LossChart
from workbench.frontends.tui.widgets.reload_log import ReloadLog
from workbench.frontends.tui.widgets.status_bar import StatusBar

BUNDLED = ("vram-dark", "vram-light", "vram-high-contrast", "vram-ansi")


# --------------------------------------------------------------------------- settings file


def test_a_missing_config_gives_defaults(tmp_path):
    config = load_config(tmp_path / "config.toml")
    assert config.theme is None and config.keys == {} and config.log_entries == DEFAULT_LOG_ENTRIES and not config.problems


def test_a_broken_config_is_reported_with_its_line_and_never_overwritten(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('theme = "vram-light"\n[keys\n')
    config = load_config(path)
    assert not config.readable and config.theme is None
    assert "not valid TOML" in config.problems[0] and "line 2" in config.problems[0]
    with pytest.raises(OSError, match="left alone"):
        save_theme(config, "vram-ansi")
    assert path.read_text() == 'theme = "vram-light"\n[keys\n'


def test_bad_values_are_named_and_the_rest_is_used(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('log_entries = -3\ncolour = "red"\n[keys]\nsnapshot = "S"\n')
    config = load_config(path)
    assert config.keys == {"snapshot": "S"} and config.log_entries == DEFAULT_LOG_ENTRIES
    assert any("log_entries" in p for p in config.problems) and any("'colour'" in p for p in config.problems)


def test_the_tensorboard_setting_is_read_and_a_bad_value_named(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("tensorboard = true\n")
    assert load_config(path).tensorboard is True and not load_config(path).problems
    path.write_text('tensorboard = "yes"\n')
    config = load_config(path)
    assert config.tensorboard is False and any("tensorboard must be true or false" in p for p in config.problems)


def test_saving_the_theme_keeps_comments_and_other_settings(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('# mine\nlog_entries = 50\n\n[keys]\nsnapshot = "S"  # capital\n')
    config = load_config(path)
    save_theme(config, "vram-light")
    text = path.read_text()
    assert text.startswith("# mine\nlog_entries = 50\n") and 'snapshot = "S"  # capital' in text
    assert text.index('theme = "vram-light"') < text.index("[keys]"), "a top-level key must come before the first table"
    save_theme(load_config(path), "vram-ansi")
    again = load_config(path)
    assert again.theme == "vram-ansi" and again.keys == {"snapshot": "S"} and again.log_entries == 50
    assert path.read_text().count("theme =") == 1


def test_saving_the_theme_creates_a_commented_file(tmp_path):
    config = load_config(tmp_path / "new" / "config.toml")
    save_theme(config, "vram-high-contrast")
    text = config.path.read_text()
    assert "[keys]" in text and load_config(config.path).theme == "vram-high-contrast"


# --------------------------------------------------------------------------- themes


def test_the_bundled_themes_load(tmp_path):
    catalog = load_catalog()
    assert set(BUNDLED) <= set(catalog.themes) and not catalog.problems
    assert catalog.themes["vram-ansi"].ansi and not catalog.themes["vram-light"].dark


def test_a_user_theme_file_is_added_and_a_bad_one_is_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    themes = tmp_path / "vram-bench" / "themes"
    themes.mkdir(parents=True)
    (themes / "mine.toml").write_text('name = "mine"\nprimary = "#ff8800"\ndark = true\n')
    (themes / "vram-light.toml").write_text('name = "vram-light"\nprimary = "#123456"\ndark = false\n')
    (themes / "broken.toml").write_text('name = "broken"\nprimary = "not-a-colour"\n')
    (themes / "typo.toml").write_text('name = "typo"\nprimary = "#ffffff"\nprimry = "#000000"\n')
    catalog = load_catalog()
    assert catalog.themes["mine"].primary == "#ff8800"
    assert catalog.themes["vram-light"].primary == "#123456", "a user file replaces the bundled theme of that name"
    assert "broken" not in catalog.themes and "typo" not in catalog.themes
    assert any("broken.toml" in p and "not a colour" in p for p in catalog.problems)
    assert any("typo.toml" in p and "primry" in p for p in catalog.problems)


def test_a_theme_file_needs_a_name_and_a_primary_colour(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('dark = true\n')
    with pytest.raises(ValueError, match="needs at least name"):
        load_theme_file(path)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"TERM": "xterm"}, ANSI_THEME),
        ({"TERM": "screen"}, ANSI_THEME),
        ({"TERM": "linux"}, ANSI_THEME),
        ({"TERM": "xterm-256color"}, DEFAULT_THEME),
        ({"TERM": "tmux-256color"}, DEFAULT_THEME),
        ({"TERM": "xterm", "COLORTERM": "truecolor"}, DEFAULT_THEME),
        ({}, DEFAULT_THEME),
    ],
)
def test_a_16_colour_terminal_starts_in_the_ansi_theme(environ, expected):
    assert terminal_default_theme(environ) == expected


def test_an_unknown_theme_on_the_command_line_is_a_one_line_error(tmp_path, capsys):
    entry = write_project(tmp_path / "proj")
    assert main(["run", str(entry), "--theme", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no theme named 'nope'" in err and "vram-high-contrast" in err and "Traceback" not in err


# --------------------------------------------------------------------------- keys


def test_rebinding_checks_action_ids_and_clashes():
    good, problems = check_keymap({"snapshot": "S", "nope": "k", "cleanup": "  "})
    assert good == {"snapshot": "S"}
    assert any("nope: no such action" in p for p in problems) and any("cleanup" in p for p in problems)
    _, clash = check_keymap({"snapshot": "c"})
    assert any("'c' is bound to both" in p for p in clash)


def test_the_readme_lists_every_action_id():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("Action ids:"))
    assert re.findall(r"`(\w+)`", line) == [action.id for action in ACTIONS]


def test_key_labels_read_as_typed():
    assert key_label("question_mark,f1") == "? / F1" and key_label("space") == "space" and key_label("ctrl+s") == "ctrl+s"


async def test_a_rebound_key_runs_the_action_and_shows_everywhere(tmp_path, session_factory):
    config_path = tmp_path / "config.toml"
    config_path.write_text('[keys]\nsnapshot = "S"\nbogus = "k"\n')
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session, config=load_config(config_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 2, what="training")
        assert any("bogus" in n.message for n in app._notifications), "a bad binding is reported in the app"
        await pilot.press("s")
        await pilot.pause(0.6)
        assert "SNAPSHOT" not in log_text(app), "the old key no longer snapshots"
        await pilot.press("S")
        await until(pilot, lambda: "SNAPSHOT" in log_text(app), what="snapshot from the new key")
        assert app.key_for("snapshot") == "S"
        palette = await open_palette(pilot, app)
        assert "Snapshot (S)" in palette


# --------------------------------------------------------------------------- palette


async def open_palette(pilot, app) -> str:
    """Open the command palette (ctrl+p) and return the text of every command it lists."""
    await pilot.press("ctrl+p")
    await until(pilot, lambda: isinstance(app.screen, CommandPalette), what="command palette")
    options = app.screen.query_one(OptionList)
    await until(pilot, lambda: options.option_count >= len(ACTIONS), what="palette commands")
    prompts = (options.get_option_at_index(index).prompt for index in range(options.option_count))
    return "\n".join(getattr(prompt, "plain", None) or str(prompt) for prompt in prompts)


async def test_the_palette_lists_every_action_with_its_key_and_runs_it(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 2, what="training")
        listed = await open_palette(pilot, app)
        for action in ACTIONS:
            assert f"{action.label} ({app.key_for(action.id)})" in listed, action.id
        assert "Theme" in listed
        await pilot.press(*"pause/resume")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: session.status().state == "paused", what="paused from the palette")


async def test_a_theme_picked_in_the_palette_applies_and_is_remembered(tmp_path, session_factory):
    config_path = tmp_path / "config.toml"
    config_path.write_text("# my settings\n")
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session, config=load_config(config_path))
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.theme == DEFAULT_THEME
        await open_palette(pilot, app)
        await pilot.press(*"theme")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette) and "theme" in str(app.screen.query_one("Input").placeholder).lower(),
                    what="theme list")
        await pilot.press(*"vram-light")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: app.theme == "vram-light", what="light theme")
        await until(pilot, lambda: 'theme = "vram-light"' in config_path.read_text(), what="theme written to the settings file")
        assert config_path.read_text().startswith("# my settings\n")


# --------------------------------------------------------------------------- layout


async def test_narrow_terminals_stack_panes_and_short_ones_draw_sparklines(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: session.status().step > 2, what="training")
        await pilot.pause(0.6)
        top, chart, memory = app.query_one("#top"), app.query_one("#chart-pane"), app.query_one("#memory")
        assert app.screen.has_class("-narrow", "-short")
        assert memory.region.y >= chart.region.bottom, "memory sits under the chart"
        assert app.query_one(LossChart).has_class("-compact") and not app.query_one("#loss-plot").display
        assert top.region.width == 80
        await pilot.resize_terminal(160, 50)
        await pilot.pause(0.8)
        assert app.screen.has_class("-wide", "-tall")
        assert memory.region.x >= chart.region.right, "memory sits beside the chart"
        assert not app.query_one(LossChart).has_class("-compact") and app.query_one("#loss-plot").display


async def test_tab_moves_focus_and_z_maximizes_the_focused_pane(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert app.focused is app.query_one(ReloadLog), "the log has focus at start (arrows scroll it)"
        await pilot.press("tab")
        assert app.focused.id == "chart-pane"
        await pilot.press("tab")
        assert app.focused.id == "memory"
        await pilot.press("z")
        assert app.screen.maximized is app.query_one("#memory")
        await pilot.press("z")
        assert app.screen.maximized is None
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused is app.query_one(ReloadLog)
        await pilot.press("z")
        assert app.screen.maximized is app.query_one(ReloadLog)
        await pilot.press("escape")
        assert app.screen.maximized is None
        await pilot.press("space")
        await until(pilot, lambda: session.status().state == "paused", what="space works whatever has focus")


# --------------------------------------------------------------------------- log


async def test_the_log_keeps_the_last_n_entries(tmp_path, session_factory):
    source = TRAIN.replace("    return {", "    print(f'line {bench.step}')\n    return {")
    config_path = tmp_path / "config.toml"
    config_path.write_text("log_entries = 5\n")
    session = session_factory(write_project(tmp_path / "proj", source))
    app = make_app(session, config=load_config(config_path))
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.query_one(ReloadLog)
        await until(pilot, lambda: session.status().step > 30, what="30 steps")
        await pilot.pause(0.5)
        text = log_text(app)
        assert log.entries == 5 and len(log.lines) == 5, text
        assert "START" not in text and "line 1\n" not in text + "\n"
        last = [line for line in text.splitlines() if "line " in line][-1]
        assert int(last.rsplit(" ", 1)[1]) >= 25


async def test_a_theme_change_redraws_the_kept_entries(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "SETUP" in log_text(app), what="log entries")
        log = app.query_one(ReloadLog)
        before = log.entries
        app.theme = "vram-light"
        await pilot.pause(0.5)
        assert log.entries == before and "SETUP" in log_text(app)


# --------------------------------------------------------------------------- tracebacks

TRACEBACK = '''Traceback (most recent call last):
  File "{root}/train.py", line 20, in step
    loss = model(x)
           ^^^^^^^^
  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1762, in _call_impl
    return forward_call(*args, **kwargs)
  File "{root}/model.py", line 9, in forward
    return self.fc(x) / self.scale
  File "/usr/lib/python3/site-packages/torch/_tensor.py", line 41, in wrapped
    return f(*args, **kwargs)
ZeroDivisionError: float division by zero
'''


def rendered(renderable) -> str:
    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_tracebacks_show_project_frames_first_then_the_error_then_the_rest(tmp_path):
    text = rendered(render_traceback(TRACEBACK.format(root=tmp_path), tmp_path))
    order = [text.index(s) for s in ("your code", "train.py:20 in step", "model.py:9 in forward", "ZeroDivisionError",
                                     "3 more frame(s) outside the project", "torch/nn/modules/module.py:1751")]
    assert order == sorted(order), text
    assert "loss = model(x)" in text and "return self.fc(x) / self.scale" in text
    assert "return forward_call" not in text, "library code lines are left out; their frames are one line each"


def test_text_that_is_not_a_traceback_is_shown_as_it_is(tmp_path):
    assert "something odd happened" in rendered(render_traceback("something odd happened\n", tmp_path))


async def test_a_step_error_in_the_app_lists_the_project_frame_first(tmp_path, session_factory):
    source = TRAIN.replace("    return {", "    if bench.step == 3:\n        torch.ones(2) @ torch.ones(3)\n    return {")
    session = session_factory(write_project(tmp_path / "proj", source))
    app = make_app(session)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: "ERROR in step" in log_text(app), what="step error")
        await pilot.pause(0.3)
        text = log_text(app)
        mine = text.index("your code")  # the headline above it already names train.py:line
        assert text.index("train.py:", mine) < text.index("RuntimeError", mine), text
        assert "torch.ones(2) @ torch.ones(3)" in text


async def test_a_key_shows_on_the_status_bar_before_the_next_redraw(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.status().state == "running", what="training")
        bar = app.query_one(StatusBar)
        await pilot.press("space")
        shown = str(bar.render())
        assert "PAUSING..." in shown or "PAUSED" in shown, shown
        await until(pilot, lambda: "PAUSED" in str(bar.render()) and "PAUSING" not in str(bar.render()), what="paused", timeout=5)
