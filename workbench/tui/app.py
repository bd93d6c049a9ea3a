"""The Textual app: a window onto a running session.

It starts the session when mounted (so `setup()` runs while the screen is
already up), reads telemetry on widget timers, and turns keys into commands.
No training logic runs here.
"""

from __future__ import annotations

import asyncio
import signal

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from workbench.events import DumpMemorySnapshot, Evaluate, Interrupt, Pause, Rebuild, RunStatements, ReloadNow, Resume, Rollback, RunCleanup, RunProfile, StepOnce, TakeSnapshot
from workbench.session import Session
from workbench.tui.screens.breakdown import BreakdownScreen
from workbench.tui.screens.help import HelpScreen
from workbench.tui.screens.leaks import LeaksScreen
from workbench.tui.screens.profile import ProfileScreen
from workbench.tui.screens.quit import ConfirmQuitScreen
from workbench.tui.screens.versions import VersionsScreen
from workbench.tui.widgets.loss_chart import LossChart
from workbench.tui.widgets.memory_gauges import MemoryGauges
from workbench.tui.widgets.reload_log import ReloadLog
from workbench.tui.widgets.setup_panel import SetupPanel
from workbench.tui.widgets.status_bar import StatusBar

PROFILE_STEPS = 3


class VramBenchApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "vram-bench"

    BINDINGS = [
        Binding("space", "toggle_pause", "Pause/Resume", id="toggle_pause", priority=True),
        Binding("n", "step_once", "Step", id="step_once", show=False),
        Binding("r", "reload", "Reload", id="reload"),
        Binding("u", "rollback", "Undo reload", id="rollback", show=False),
        Binding("R", "rebuild", "Rebuild", id="rebuild", show=False),
        Binding("x", "run_statements", "Run held statements", id="run_statements", show=False),
        Binding("e", "evaluate", "Eval", id="evaluate"),
        Binding("c", "cleanup", "Cleanup", id="cleanup"),
        Binding("b", "breakdown", "Breakdown", id="breakdown"),
        Binding("v", "versions", "Versions", id="versions"),
        Binding("o", "last_profile", "Last profile", id="last_profile", show=False),
        Binding("t", "leaks", "Leaks", id="leaks", show=False),
        Binding("m", "memory_snapshot", "Memory snapshot", id="memory_snapshot", show=False),
        Binding("s", "snapshot", "Snapshot", id="snapshot"),
        Binding("p", "profile", "Profile", id="profile"),
        Binding("question_mark,f1", "help", "Help", id="help", key_display="?"),
        Binding("i", "interrupt", "Interrupt step", id="interrupt", show=False),
        Binding("q", "quit", "Quit", id="quit"),
        Binding("ctrl+c", "quit", "Quit", id="quit_ctrl_c", show=False, priority=True),
    ]

    KEY_HELP = [
        ("space", "pause / resume training"),
        ("n", "run one step while paused"),
        ("r", "reload now: re-read every project file and apply what changed"),
        ("u", "undo the last reload (roll back to the previous code version)"),
        ("R", "rebuild: run setup() again with held-back changes, carrying weights and optimizer state over"),
        ("x", "run the changed module statements a reload held back (e.g. MODEL = Net())"),
        ("e", "run evaluate(state, bench) now; its scalars join the chart"),
        ("c", "cleanup: gc.collect + torch.cuda.empty_cache, and what it freed"),
        ("v", "versions table: per code version steps/s, saved activations, peaks, loss, and the change vs the previous"),
        ("o", "the last profile's top operators by time and memory"),
        ("b", "memory breakdown: parameters, gradients, optimizer state, buffers, activations, cache; with advice"),
        ("t", "leak finder: every live tensor by owner; the largest unowned ones and what keeps them alive"),
        ("m", "CUDA memory snapshot for pytorch.org/memory_viz (to .vram-bench/memory/; --record-memory for stacks)"),
        ("s", "snapshot: checkpoint of every module and optimizer to .vram-bench/snapshots/"),
        ("p", f"profile the next {PROFILE_STEPS} steps with torch.profiler (trace to .vram-bench/traces/)"),
        ("i", "interrupt a running step (raises KeyboardInterrupt in it; the model stays)"),
        ("? / F1", "this help"),
        ("q", "quit; with unsaved progress it offers a snapshot first (ctrl+c too)"),
    ]

    def __init__(self, session: Session, *, timestamps: bool = True) -> None:
        super().__init__()
        self.session = session
        self._timestamps = timestamps

    def compose(self) -> ComposeResult:
        yield StatusBar(self.session, id="status")
        with Horizontal(id="top"):
            with Vertical(id="chart-pane") as chart_pane:
                chart_pane.border_title = "Loss"
                yield SetupPanel(self.session, id="setup")
                yield LossChart(self.session.telemetry, id="chart")
            gauges = MemoryGauges(self.session.telemetry, window=self.session.config.memory_window, id="memory")
            gauges.border_title = "Memory"
            yield gauges
        log = ReloadLog(self.session.bus, self.session.project.root, timestamps=self._timestamps, id="log")
        log.border_title = "Log"
        yield log
        yield Footer()

    def on_mount(self) -> None:
        # Started here, not before: Textual has redirected stdout by now, so the session's
        # print routing wraps Textual's and the training thread's prints land in the log.
        self.session.start()
        self._install_signal_handlers()

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP (a dropped SSH link): final snapshot, then exit. SIGINT: ask, like ctrl+c."""
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, self._quit_with_snapshot)
            loop.add_signal_handler(signal.SIGINT, lambda: self.call_later(self.action_quit))
            self._signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
        except (NotImplementedError, RuntimeError, ValueError):
            self._signals = ()

    def on_unmount(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for sig in getattr(self, "_signals", ()):
            loop.remove_signal_handler(sig)

    def _quit_with_snapshot(self) -> None:
        self.session.request_quit(final_snapshot=True)
        self.exit()

    async def action_quit(self) -> None:
        unsaved = self.session.unsaved_steps
        if unsaved <= 0:
            self.exit()
            return
        if isinstance(self.screen, ConfirmQuitScreen):
            return

        def chosen(choice: str | None) -> None:
            if choice == "snapshot":
                self._quit_with_snapshot()
            elif choice == "quit":
                self.exit()

        self.push_screen(ConfirmQuitScreen(unsaved), chosen)

    def action_interrupt(self) -> None:
        self.session.send(Interrupt())

    # Actions: each one only sends a command --------------------------------------------
    def action_toggle_pause(self) -> None:
        state = self.session.status().state
        if state == "running":
            self.session.send(Pause())
        elif state == "paused":
            self.session.send(Resume())
        else:
            self.notify(f"Cannot pause or resume while {state}.", severity="warning")

    def action_step_once(self) -> None:
        self.session.send(StepOnce())

    def action_reload(self) -> None:
        self.session.send(ReloadNow())

    def action_rollback(self) -> None:
        self.session.send(Rollback())

    def action_rebuild(self) -> None:
        self.session.send(Rebuild())

    def action_run_statements(self) -> None:
        self.session.send(RunStatements())

    def action_versions(self) -> None:
        self.push_screen(VersionsScreen(self.session))

    def action_last_profile(self) -> None:
        self.push_screen(ProfileScreen(self.session.last_profile))

    def action_breakdown(self) -> None:
        self.push_screen(BreakdownScreen(self.session))

    def action_leaks(self) -> None:
        self.push_screen(LeaksScreen(self.session))

    def action_memory_snapshot(self) -> None:
        self.session.send(DumpMemorySnapshot())

    def action_evaluate(self) -> None:
        self.session.send(Evaluate())

    def action_cleanup(self) -> None:
        self.session.send(RunCleanup())

    def action_snapshot(self) -> None:
        self.session.send(TakeSnapshot())

    def action_profile(self) -> None:
        self.session.send(RunProfile(steps=PROFILE_STEPS))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.KEY_HELP))


def make_app(session: Session, *, timestamps: bool = True) -> VramBenchApp:
    """Build the app around a session (tests build it the same way, with their own session)."""
    return VramBenchApp(session, timestamps=timestamps)
