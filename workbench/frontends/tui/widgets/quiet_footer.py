"""The footer, rebuilt only when the keys it shows change.

Why: Textual's Footer removes and mounts all its key widgets whenever the focus
moves (tab between panes, help opening), even when it would show the same keys.
While it does, the screen's updates are held back: on a busy machine that was
most of the 50-150 ms between pressing `?` and seeing the help.
"""

from __future__ import annotations

from collections.abc import Hashable

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen) -> tuple[Hashable, ...]:
    """What the footer would draw for this screen: each shown binding's key, label, state and tooltip."""
    app = screen.app
    return tuple(
        (binding.action, binding.key, app.get_key_display(binding), binding.description, enabled, tooltip)
        for _node, binding, enabled, tooltip in screen.active_bindings.values()
        if binding.show
    )


class QuietFooter(Footer):
    """A Footer that skips rebuilds which would draw the same keys."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._drawn: tuple[Hashable, ...] | None = None

    def bindings_changed(self, screen: Screen) -> None:
        will_recompose = screen.app.app_focus and self.is_attached and screen is self.screen
        if will_recompose:
            keys = shown_keys(screen)
            if self._bindings_ready and keys == self._drawn:
                return
            self._drawn = keys
        super().bindings_changed(screen)
