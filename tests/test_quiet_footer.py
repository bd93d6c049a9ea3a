"""The footer is rebuilt only when the keys it shows change (Textual's rebuilds it on every focus move)."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static
from textual.widgets._footer import FooterKey

from workbench.frontends.tui.widgets.quiet_footer import QuietFooter


class Pane(Static, can_focus=True):
    """Focusable, no keys of its own: moving between two of these changes nothing in the footer."""


class Editor(Static, can_focus=True):
    BINDINGS = [Binding("ctrl+s", "noop", "Save")]  # shown: focusing it changes the footer

    def action_noop(self) -> None:
        pass


class FooterApp(App[None]):
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("space", "noop", "Pause")]

    def compose(self) -> ComposeResult:
        yield Pane("one", id="one")
        yield Pane("two", id="two")
        yield Editor("editor", id="editor")
        yield Input(id="input")
        yield QuietFooter()

    def action_noop(self) -> None:
        pass


def footer_keys(app: App) -> list[FooterKey]:
    return list(app.query(FooterKey))


def labels(app: App) -> list[str]:
    return [key.description for key in footer_keys(app)]


async def test_focus_moves_that_keep_the_keys_keep_the_footer_widgets() -> None:
    app = FooterApp()
    async with app.run_test() as pilot:
        app.query_one("#one").focus()
        await pilot.pause()
        before = footer_keys(app)
        assert labels(app) == ["Quit", "Pause", "palette"]

        app.query_one("#two").focus()
        await pilot.pause()
        await pilot.pause()
        assert footer_keys(app) == before and all(a is b for a, b in zip(footer_keys(app), before))


async def test_a_focus_move_that_changes_the_keys_rebuilds_the_footer() -> None:
    app = FooterApp()
    async with app.run_test() as pilot:
        app.query_one("#one").focus()
        await pilot.pause()
        before = footer_keys(app)

        app.query_one("#editor").focus()
        await pilot.pause()
        await pilot.pause()
        assert "Save" in labels(app)
        assert not any(a is b for a, b in zip(footer_keys(app), before))

        app.query_one("#one").focus()
        await pilot.pause()
        await pilot.pause()
        assert labels(app) == ["Quit", "Pause", "palette"]
