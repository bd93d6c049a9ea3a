"""The Textual app: a window onto a running session.

It reads a `SessionSource` (workbench/protocol/source.py): a session process over its
socket, or in tests an in-process session. It starts it when mounted (a remote session:
starts reading; an in-process one: `setup()` runs while the screen is already up), reads
telemetry on widget timers, and turns keys into commands. No training logic runs here,
and leaving the app (q, d, a closed terminal) leaves the session training.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable, Mapping
from functools import partial

from textual.actions import ActionParseResult
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal
from textual.dom import DOMNode
from textual.screen import Screen
from textual.theme import Theme

from workbench.config import DEFAULT_LOG_ENTRIES, UserConfig, save_theme
from workbench.frontends.tui import collector
from workbench.protocol.events import Command, DumpMemorySnapshot, Evaluate, Interrupt, Pause, Rebuild, RunStatements, ReloadNow, Resume, Rollback, RunCleanup, RunProfile, StepOnce, TakeSnapshot
from workbench.protocol.remote import RemoteSession
from workbench.protocol.source import SessionSource
from workbench.frontends.tui.keys import ACTIONS, PROFILE_STEPS, bindings, check_keymap, key_label, keys_in_effect
from workbench.frontends.tui.screens.breakdown import BreakdownScreen
from workbench.frontends.tui.screens.confirm import ConfirmScreen
from workbench.frontends.tui.screens.leaks import LeaksScreen
from workbench.frontends.tui.screens.profile import ProfileScreen
from workbench.frontends.tui.screens.quit import ConfirmQuitScreen
from workbench.frontends.tui.screens.versions import VersionsScreen
from workbench.frontends.tui.theme_files import DEFAULT_THEME, load_catalog
from workbench.frontends.tui.widgets.chart_pane import ChartPane
from workbench.frontends.tui.widgets.help_panel import HelpPanel
from workbench.frontends.tui.widgets.memory_gauges import MemoryGauges
from workbench.frontends.tui.widgets.quiet_footer import QuietFooter
from workbench.frontends.tui.widgets.reload_log import ReloadLog
from workbench.frontends.tui.widgets.status_bar import StatusBar

# Keys the app does not own but the help screen should list.
OTHER_KEYS = (
    ("tab / shift+tab", "move the focus between the chart, memory and log panes (arrows and page keys then scroll the log)"),
    ("esc", "restore a maximized pane; close a dialog"),
    ("ctrl+p", "command palette: every action by name, and the theme switcher"),
)

FREEZE_AFTER = 1.0  # seconds after mount: the first frames (the replayed history drawn) are out by then


class VramBenchApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "vram-bench"
    BINDINGS = bindings()
    AUTO_FOCUS = "#log"  # arrows and page keys scroll the log from the start; tab moves on
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, HelpPanel"  # help opens over a maximized pane too
    # Below 100 columns the panes stack; below 30 rows the panes get their minimum heights.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def __init__(
        self,
        session: SessionSource,
        *,
        timestamps: bool = True,
        config: UserConfig | None = None,
        theme: str | None = None,
        themes: dict[str, Theme] | None = None,
        problems: Iterable[str] = (),
    ) -> None:
        # NO_COLOR: Textual's greyscale filter (used unless ANSI colours are on) fails on some unstyled
        # segments of the plot; with ANSI colours on, it uses the plain no-colour filter instead.
        super().__init__(ansi_color=True if "NO_COLOR" in os.environ else None)
        self.session = session
        self._timestamps = timestamps
        self.config = config  # None: settings come from the caller and nothing is written back
        self.problems = list(problems)
        if themes is None:
            catalog = load_catalog()
            themes = catalog.themes
            self.problems += catalog.problems
        for registered in themes.values():
            self.register_theme(registered)
        wanted = theme or (config.theme if config else None) or DEFAULT_THEME
        if wanted not in self.available_themes:
            self.problems.append(f"theme {wanted!r} is not installed; using {DEFAULT_THEME}")
            wanted = DEFAULT_THEME
        self.theme = wanted
        self._remembered_theme = wanted
        self._collector_hold = collector.CollectorHold()
        self._froze = False  # this app froze its process's survivors (collector.py): released when it leaves
        self._stopping = False  # this app asked the session to stop: leave when it has
        self._end_said = False
        self.keymap, key_problems = check_keymap(config.keys if config else {})
        self.problems += key_problems

    def compose(self) -> ComposeResult:
        yield StatusBar(self.session, id="status")
        with Horizontal(id="top"):
            chart_pane = ChartPane(self.session, id="chart-pane")
            chart_pane.border_title = "Loss"
            yield chart_pane
            gauges = MemoryGauges(self.session.telemetry, window=self.session.memory_window, id="memory")
            gauges.border_title = "Memory"
            yield gauges
        entries = self.config.log_entries if self.config else DEFAULT_LOG_ENTRIES
        log = ReloadLog(self.session.bus, self.session.project_root, timestamps=self._timestamps, entries=entries, id="log")
        log.border_title = "Log"
        yield log
        yield HelpPanel(id="help", covers=("#status", "#top", "#log"))  # hidden; over the panes in a layer of its own (app.tcss)
        yield QuietFooter()

    def on_mount(self) -> None:
        # Started here, not before: Textual has redirected stdout by now, so the session's
        # print routing wraps Textual's and the training thread's prints land in the log.
        self.session.start()
        self._install_signal_handlers()
        if self.keymap:
            self.set_keymap(self.keymap)
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        for problem in self.problems:
            self.notify(problem, title="Settings", severity="warning", timeout=20)
        self.set_interval(0.25, self._watch_the_session, name="session-end")
        if isinstance(self.session, RemoteSession):  # the process is this app's alone (collector.py)
            self.set_timer(FREEZE_AFTER, self._freeze, name="gc-freeze")

    def _freeze(self) -> None:
        """The app is up (its history drawn): its long-lived objects leave the collector's walks."""
        if not self._froze:
            collector.freeze_survivors()
            self._froze = True

    def _watch_the_session(self) -> None:
        """The session ended: the app leaves if this app stopped it; otherwise it says so and stays until q."""
        ended = self.session.ended
        if ended is None or self._end_said:
            return
        self._end_said = True
        if self._stopping:
            self.exit()
            return
        self.notify(ended, title="Session ended", severity="error", timeout=3600)

    def _remember_theme(self, theme: Theme) -> None:
        """A theme picked in the palette is the one the next session starts with."""
        if theme.name == self._remembered_theme:
            return
        self._remembered_theme = theme.name
        if self.config is None:
            return
        try:
            save_theme(self.config, theme.name)
        except OSError as exc:
            self.notify(f"Could not remember the theme: {exc}", severity="warning")

    def key_for(self, action_id: str) -> str:
        """The key(s) that run an action now, as the user should type them."""
        return key_label(keys_in_effect(self.keymap)[action_id])

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): every action with its key, then Textual's theme, maximize and screenshot."""
        for action in ACTIONS:
            yield SystemCommand(f"{action.label} ({self.key_for(action.id)})", action.help, partial(self.run_action, action.action))
        for command in super().get_system_commands(screen):
            if command.title not in ("Quit", "Keys"):
                yield command

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP (a closed terminal, a dropped SSH link): detach, the session trains on. SIGINT: ask, like ctrl+c."""
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, self.action_detach)
            loop.add_signal_handler(signal.SIGINT, lambda: self.call_later(self.action_quit))
            self._signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
        except (NotImplementedError, RuntimeError, ValueError):
            self._signals = ()

    async def run_action(self, action: str | ActionParseResult, default_namespace: DOMNode | None = None,
                         namespaces: Mapping[str, DOMNode] | None = None) -> bool:
        """Every action (a key, the palette, a click): automatic garbage collection waits until the screen
        shows what it did (collector.py), so a collection that falls due meanwhile runs after that frame."""
        self._collector_hold.hold()
        try:
            return await super().run_action(action, default_namespace, namespaces)
        finally:
            self._collector_hold.release_after_refresh(self)

    def on_unmount(self) -> None:
        self._collector_hold.release()
        if self._froze:
            self._froze = False
            collector.release()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in getattr(self, "_signals", ()):
            loop.remove_signal_handler(sig)

    def _stop(self, final_snapshot: bool) -> None:
        """Stop the session (this app leaves once it has ended, after its final snapshot if asked)."""
        self._stopping = True
        self.session.request_quit(final_snapshot=final_snapshot)
        self.query_one(StatusBar).follow("STOPPING (final snapshot)..." if final_snapshot else "STOPPING...")

    def action_detach(self) -> None:
        """Leave the app; the session goes on training (come back with vram-bench attach)."""
        self.exit()

    async def action_quit(self) -> None:
        if self._help_shown():
            self._help_panel().hide()  # q closes the help, as in the report screens
            return
        if self.session.ended is not None:
            self.exit()
            return
        if isinstance(self.screen, ConfirmQuitScreen):
            return

        def chosen(choice: str | None) -> None:
            if choice == "detach":
                self.action_detach()
            elif choice == "snapshot":
                self._stop(final_snapshot=True)
            elif choice == "quit":
                self._stop(final_snapshot=False)

        self.push_screen(ConfirmQuitScreen(self.session.unsaved_steps, getattr(self.session, "name", "")), chosen)

    def _send(self, command: Command, pending: str | None = None) -> None:
        """Send a command to the worker and let the status bar follow it closely until it lands."""
        self.session.send(command)
        self.query_one(StatusBar).follow(pending)

    def action_interrupt(self) -> None:
        self._send(Interrupt(), "INTERRUPTING...")

    # Actions: each one only sends a command --------------------------------------------
    def action_toggle_pause(self) -> None:
        state = self.session.status().state
        if state == "running":
            self._send(Pause(), "PAUSING...")
        elif state == "paused":
            self._send(Resume(), "RESUMING...")
        else:
            self.notify(f"Cannot pause or resume while {state}.", severity="warning")

    def action_step_once(self) -> None:
        self._send(StepOnce())

    def action_reload(self) -> None:
        self._send(ReloadNow())

    def action_rollback(self) -> None:
        self._send(Rollback())

    def action_rebuild(self) -> None:
        """Rebuild re-runs setup(): ask first, it replaces everything in the state but carried tensors."""
        if isinstance(self.screen, ConfirmScreen):
            return
        held = self.session.status().needs_rebuild
        reason = f"Held back: {', '.join(held)}.\n" if held else ""
        message = (
            f"{reason}Rebuild builds the state again from the code on disk: the module lines x would run, the lines "
            "that built at import a model, an optimizer, or what old code made (a config of a changed class, a "
            "data loader whose workers run old code), then setup(). Parameters, buffers and optimizer state "
            "carry over by name and shape (layers renumbered by one inserted into a Sequential: by their place); "
            "so do, where the new setup() makes them alike, the counters and tensors training changed, loaders' "
            "places, random streams, LR schedules and objects with a state_dict() (an EMA). Iterators start fresh. "
            "If the new setup() fails, nothing changes."
        )

        def chosen(yes: bool | None) -> None:
            if yes:
                self._send(Rebuild(), "REBUILDING...")

        self.push_screen(ConfirmScreen("Rebuild?", message, "rebuild now"), chosen)

    def action_run_statements(self) -> None:
        self._send(RunStatements())

    def action_versions(self) -> None:
        self.push_screen(VersionsScreen(self.session))

    def action_last_profile(self) -> None:
        self.push_screen(ProfileScreen(self.session.last_profile))

    def action_breakdown(self) -> None:
        self.push_screen(BreakdownScreen(self.session))

    def action_leaks(self) -> None:
        self.push_screen(LeaksScreen(self.session))

    def action_memory_snapshot(self) -> None:
        self._send(DumpMemorySnapshot())

    def action_evaluate(self) -> None:
        self._send(Evaluate())

    def action_cleanup(self) -> None:
        self._send(RunCleanup())

    def action_snapshot(self) -> None:
        self._send(TakeSnapshot())

    def action_profile(self) -> None:
        self._send(RunProfile(steps=PROFILE_STEPS))

    @property
    def escape_to_minimize(self) -> bool:
        """Escape closes the help first, even over a maximized pane."""
        return super().escape_to_minimize and not self._help_shown()

    def _help_panel(self) -> HelpPanel:
        return self.screen_stack[0].query_one(HelpPanel)  # on the main screen, whatever is on top

    def _help_shown(self) -> bool:
        return self.screen is self.screen_stack[0] and self._help_panel().shown

    def action_toggle_output(self) -> None:
        log = self.query_one(ReloadLog)
        shown = log.toggle_output()
        log.border_title = "Log" if shown else "Log (output hidden: l shows it)"

    def action_zoom(self) -> None:
        """Maximize the focused pane (the chart if none has focus), or restore it."""
        if self._help_shown():
            return
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        target = screen.focused or self.query_one(ChartPane)
        target.focus()
        screen.maximize(target)

    def action_help(self) -> None:
        """Show the help over the panes, or hide it (the help key toggles)."""
        if self.screen is not self.screen_stack[0]:
            return  # a dialog or report is open: it has the keyboard
        panel = self._help_panel()
        if panel.shown:
            panel.hide()
        else:
            panel.show([(self.key_for(a.id), a.help) for a in ACTIONS] + list(OTHER_KEYS))


def make_app(
    session: SessionSource,
    *,
    timestamps: bool = True,
    config: UserConfig | None = None,
    theme: str | None = None,
    themes: dict[str, Theme] | None = None,
    problems: Iterable[str] = (),
) -> VramBenchApp:
    """Build the app around a session and settings (tests build it the same way, with their own)."""
    return VramBenchApp(session, timestamps=timestamps, config=config, theme=theme, themes=themes, problems=problems)
