"""The Textual app on a real session, driven with `App.run_test()` and its Pilot."""

from __future__ import annotations

import io
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console
from textual.errors import NoWidget

from tests.fakes import FakeDevice, frozen_host
from workbench.engine.project import load_project
from workbench.engine.session import Session, SessionConfig
from workbench.frontends.tui.app import make_app
from workbench.frontends.tui.keys import ACTIONS
from workbench.frontends.tui.settings import load_config
from workbench.frontends.tui.widgets.loss_chart import LossChart
from workbench.frontends.tui.widgets.memory_gauges import MemoryGauges
from workbench.frontends.tui.widgets.reload_log import ReloadLog
from workbench.frontends.tui.widgets.setup_panel import SetupPanel
from workbench.frontends.tui.widgets.status_bar import StatusBar

TRAIN = textwrap.dedent(
    """
    import time
    import torch

    TAG = 1.0

    def setup(bench):
        model = torch.nn.Linear(4, 1)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}

    def step(state, bench):
        time.sleep(0.002)
        x = torch.randn(8, 4)
        loss = ((state["model"](x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward(); state["opt"].step(); state["opt"].zero_grad()
        return {"loss": loss, "tag": TAG}
    """
)


def write_project(folder: Path, source: str = TRAIN) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / "train.py"
    entry.write_text(source)
    return entry


def new_session(entry: Path, **config: object) -> Session:
    probe = config.pop("probe", None)
    host = config.pop("host_reader", None)
    kwargs = {"probe": probe} if probe is not None else {}
    if host is not None:
        kwargs["host_reader"] = host
    settings = {"device": torch.device("cpu"), "exit_at_max_steps": False, **config}
    return Session(load_project(entry), SessionConfig(**settings), **kwargs)  # type: ignore[arg-type]


async def until(pilot, condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def log_text(app) -> str:
    log = app.query_one(ReloadLog)
    return "\n".join(strip.text for strip in log.lines)


@pytest.fixture
def session_factory():
    sessions: list[Session] = []

    def make(entry: Path, **config: object) -> Session:
        session = new_session(entry, **config)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.close()


async def test_panes_present_space_toggles_pause_and_q_exits(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: session.status().state == "running" and session.status().step > 3, what="training")
        await until(pilot, lambda: not app.query_one("#chart-pane").has_class("-setup"), what="chart shown")
        for widget in (StatusBar, LossChart, MemoryGauges, ReloadLog):
            assert app.query_one(widget).display

        await pilot.press("space")
        await until(pilot, lambda: session.status().state == "paused", what="pause")
        paused_at = session.status().step
        await pilot.pause(0.3)
        assert session.status().step == paused_at, "steps ran while paused"
        await until(pilot, lambda: "PAUSED" in str(app.query_one(StatusBar).render()), what="status bar says paused")

        await pilot.press("space")
        await until(pilot, lambda: session.status().step > paused_at + 3, what="resume")
        assert session.status().state == "running"

        await pilot.press("q")  # unsaved progress: it asks first
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmQuitScreen", what="quit question")
        await pilot.press("escape")
        await until(pilot, lambda: type(app.screen).__name__ != "ConfirmQuitScreen", what="stay")
        assert app.is_running
        await pilot.press("q")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmQuitScreen", what="quit question")
        await pilot.press("q")  # q twice: detach, the session trains on
        await until(pilot, lambda: not app.is_running, what="app exit", timeout=5)
    assert session.status().state == "running" and session.ended is None


async def test_quit_with_a_snapshot_first(tmp_path, session_factory):
    entry = write_project(tmp_path / "proj")
    session = session_factory(entry)
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        await pilot.press("q")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmQuitScreen", what="quit question")
        await pilot.press("s")
        await until(pilot, lambda: not app.is_running, what="app exit", timeout=5)
    session.close()
    snapshots = sorted((session.run_dir / "snapshots").glob("step-*.pt"))
    assert snapshots and session.last_snapshot == str(snapshots[-1])
    assert int(snapshots[-1].stem.split("-")[1]) == session.worker.step


async def test_save_shows_reload_in_log_and_new_series(tmp_path, session_factory):
    entry = write_project(tmp_path / "proj")
    session = session_factory(entry)
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        assert session.wait_until_watching()
        entry.write_text(TRAIN.replace('"tag": TAG}', '"tag": TAG, "extra": 7.0}'))
        await until(pilot, lambda: "RELOAD" in log_text(app) and "step" in log_text(app), what="reload line")
        await until(pilot, lambda: session.telemetry.latest("extra") == 7.0, what="new series")
        await until(pilot, lambda: "extra" in str(app.query_one("#series-rows").render()), what="series row")
        assert session.status().code_version == 1

        entry.write_text(TRAIN.replace("TAG = 1.0", "TAG = (1.0"))
        await until(pilot, lambda: "RELOAD FAILED" in log_text(app), what="failed reload line")
        assert "train.py:5" in log_text(app)
        assert session.status().state == "running"


async def test_memory_pane_without_gpu_says_so_plainly(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        gauges = app.query_one(MemoryGauges)
        await until(pilot, lambda: "No GPU" in str(gauges.render()), what="no-GPU note")
        text = str(gauges.render())
        assert "RSS" in text and "RAM" in text
        assert "error" not in text.lower()


async def test_memory_pane_shows_fake_gpu_and_cleanup_frees_cache(tmp_path, session_factory):
    device = FakeDevice()
    session = session_factory(write_project(tmp_path / "proj"), probe=device)
    app = make_app(session)
    async with app.run_test(size=(110, 34)) as pilot:
        gauges = app.query_one(MemoryGauges)
        await until(pilot, lambda: "Fake H100" in str(gauges.render()), what="GPU gauge")
        text = str(gauges.render())
        assert "cached 4.00 GiB" in " ".join(text.split())
        assert "live 10.00 GiB" in " ".join(text.split())

        await pilot.press("c")
        await until(pilot, lambda: "CLEANUP" in log_text(app), what="cleanup line")
        assert device.empty_cache_calls == 1
        assert "freed 4.00 GiB" in log_text(app)
        await until(pilot, lambda: "cached 0 B" in " ".join(str(gauges.render()).split()), what="cache emptied")


async def test_setup_panel_shows_progress_then_failure_then_recovers_on_save(tmp_path, session_factory):
    failing = TRAIN.replace(
        "def setup(bench):\n", "def setup(bench):\n    time.sleep(1.0)\n    raise RuntimeError('weights not found')\n"
    )
    entry = write_project(tmp_path / "proj", failing)
    session = session_factory(entry)
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.query_one(SetupPanel)
        await until(pilot, lambda: "Running setup()" in str(panel.render()), what="setup progress")
        assert not app.query_one(LossChart).display or app.query_one("#chart-pane").has_class("-setup")
        await until(pilot, lambda: "setup() failed" in str(panel.render()), what="setup failure")
        assert "weights not found" in str(panel.render())
        # The `setup` event (the panel) comes before the `error` event (the log's line): wait for the line.
        await until(pilot, lambda: "RuntimeError" in log_text(app), what="the error in the log")

        assert session.wait_until_watching()
        entry.write_text(TRAIN)
        await until(pilot, lambda: session.status().state == "running" and session.status().step > 2, what="recovery")
        await until(pilot, lambda: not app.query_one("#chart-pane").has_class("-setup"), what="chart back")


def help_shown(app) -> bool:
    return app.query_one("#help").display


async def test_help_lists_every_key(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(100, 34)) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: help_shown(app), what="help shown")
        console = Console(width=100, record=True, file=io.StringIO())
        for widget in app.query("#help Static"):
            console.print(widget.content)
        shown = console.export_text()
        for action in ACTIONS:
            assert app.key_for(action.id) in shown and action.help[:40] in shown, action.id
        assert "? / F1" in shown and "tab / shift+tab" in shown and "ctrl+p" in shown
        await pilot.press("escape")
        await until(pilot, lambda: not help_shown(app), what="help closed")


async def test_help_is_drawn_over_the_panes_and_every_way_out_restores_them(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(100, 34)) as pilot:
        await until(pilot, lambda: session.status().state == "running", what="training")
        panes = [app.query_one(selector) for selector in ("#status", "#top", "#log")]
        log = app.query_one("#log")
        assert app.focused is log
        sizes = [pane.size for pane in panes]

        for close in ("escape", "q", "question_mark", "f1"):
            await pilot.press("question_mark")
            await until(pilot, lambda: help_shown(app), what="help shown")
            # Over the panes, on the same screen; the focus is in the help (so arrows scroll it).
            assert app.screen is app.screen_stack[0]
            assert app.screen.virtual_size == app.screen.size  # no scrollbar: the help fits the screen
            assert app.focused is not None and app.query_one("#help") in app.focused.ancestors_with_self
            for pane in panes:  # out of the layout while covered: their updates draw nothing
                with pytest.raises(NoWidget):
                    app.screen.find_widget(pane)
            await pilot.press(close)
            await until(pilot, lambda: not help_shown(app), what=f"help closed by {close}")
            assert app.focused is log, close
            assert [pane.size for pane in panes] == sizes  # back as they were (a resize re-renders the plot, re-wraps the log)
            assert all(app.screen.find_widget(pane).region.area > 0 for pane in panes)
        assert app.is_running and session.status().state == "running"  # q closed the help, did not quit

        # tab and shift+tab close the help and move on from the pane that had the focus.
        order = [w.id for w in app.screen.focus_chain]
        for key, step in (("tab", 1), ("shift+tab", -1)):
            start = app.focused
            await pilot.press("question_mark")
            await until(pilot, lambda: help_shown(app), what="help shown")
            await pilot.press(key)
            await until(pilot, lambda: not help_shown(app), what=f"help closed by {key}")
            assert app.focused is not None and app.focused.id == order[(order.index(start.id) + step) % len(order)], key
            assert all(app.screen.find_widget(pane).region.area > 0 for pane in panes)

        # Opens over a maximized pane too, and escape closes the help before it restores the pane.
        await pilot.press("z")
        await until(pilot, lambda: app.screen.maximized is not None, what="zoom")
        await pilot.press("question_mark")
        await until(pilot, lambda: help_shown(app), what="help over a zoomed pane")
        assert app.query_one("#help").region.area > 0
        await pilot.press("escape")
        await until(pilot, lambda: not help_shown(app), what="help closed")
        assert app.screen.maximized is not None
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.maximized is None, what="zoom restored")


async def test_lines_logged_under_the_help_are_there_and_followed_when_it_closes(tmp_path, session_factory):
    source = TRAIN.replace("    return {", "    print(f'line from step {bench.step}')\n    return {")
    session = session_factory(write_project(tmp_path / "proj", source))
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        log = app.query_one(ReloadLog)
        await until(pilot, lambda: log.max_scroll_y > 0, what="a log longer than its pane")
        await pilot.press("question_mark")
        await until(pilot, lambda: help_shown(app), what="help shown")
        lines_before = len(log.lines)
        await until(pilot, lambda: len(log.lines) > lines_before + 20, what="lines logged under the help")
        await pilot.press("escape")
        await until(pilot, lambda: not help_shown(app), what="help closed")
        # Still following the newest line (RichLog scrolls after the refresh that follows a write).
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y > 0, what="the log at its newest line")
        shown = "\n".join(strip.text for strip in log.render_lines(log.scrollable_content_region.reset_offset))
        assert "line from step" in shown


async def test_prints_from_step_land_in_the_log(tmp_path, session_factory):
    source = TRAIN.replace("    return {", "    if bench.step == 2:\n        print('hello from step')\n    return {")
    session = session_factory(write_project(tmp_path / "proj", source))
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: "hello from step" in log_text(app), what="print in log")
        assert "[stdout]" in log_text(app)


async def test_l_hides_what_the_code_prints_and_keeps_the_reloads_however_much_was_printed(tmp_path, session_factory):
    """A chatty trainer (makemore prints every 10 steps and samples every 200) scrolled a reload's notes out of the log;
    `l` shows the reloads, errors and actions alone, from a store of their own that prints cannot push out."""
    source = TRAIN.replace("    return {", "    print(f'status line {bench.step}')\n    return {")
    entry = write_project(tmp_path / "proj", source)
    config_path = tmp_path / "config.toml"
    config_path.write_text("log_entries = 30\n")
    session = session_factory(entry)
    app = make_app(session, config=load_config(config_path))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        assert session.wait_until_watching()
        entry.write_text(source.replace("TAG = 1.0", "TAG = 2.0"))
        await until(pilot, lambda: session.status().code_version == 1, what="the reload")
        log = app.query_one(ReloadLog)
        # More prints than the log keeps entries: the reload has left the full log.
        await until(pilot, lambda: "RELOAD" not in log_text(app), what="the reload pushed out by prints")
        await pilot.press("l")
        await until(pilot, lambda: not log.showing_output, what="output hidden")
        assert "code v1: TAG" in log_text(app), log_text(app)
        assert "status line" not in log_text(app) and "hidden" in str(log.border_title)
        lines = len(log.lines)
        await until(pilot, lambda: session.status().step > 60, what="more steps")
        assert len(log.lines) == lines, "prints stay out of the log while hidden"
        await pilot.press("l")
        await until(pilot, lambda: "status line" in log_text(app), what="output shown again")
        assert log.border_title == "Log"


# --------------------------------------------------------------------------- snapshot

DETERMINISTIC = textwrap.dedent(
    """
    import torch

    def setup(bench):
        model = torch.nn.Linear(2, 1)
        return {"model": model}

    def step(state, bench):
        return {"loss": 4.0 / (1 + 0.2 * bench.step), "lr": 0.001 * (1 + bench.step % 5)}
    """
)


def settled_snapshot(tmp_path, snap_compare, size: tuple[int, int], theme: str = "vram-dark") -> bool:
    """A deterministic session (fake GPU, frozen host memory) after 40 steps, its memory history full."""
    entry = write_project(tmp_path / "snapshot_demo", DETERMINISTIC)
    session = new_session(
        entry, max_steps=40, probe=FakeDevice(), host_reader=frozen_host, watch=False, memory_interval=0.02,
        memory_idle_interval=None,  # it waits for a full memory history while paused
    )
    app = make_app(session, timestamps=False, theme=theme)

    async def settle(pilot) -> None:
        await until(pilot, lambda: session.status().state == "paused" and session.status().step == 40, what="40 steps")
        # History lines are as wide as the samples they have: wait until they are full.
        await until(pilot, lambda: len(session.telemetry.memory_history(300)) >= 100, what="memory history")
        await pilot.pause(1.5)  # every widget timer (the chart: 1 Hz) has fired since

    try:
        return snap_compare(app, terminal_size=size, run_before=settle)
    finally:
        session.close()


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=["80x24", "120x40", "200x60"])
def test_main_screen_snapshot(tmp_path, snap_compare, size):
    """The default theme from the smallest terminal (panes stacked, sparkline chart) to a large one."""
    assert settled_snapshot(tmp_path, snap_compare, size)


@pytest.mark.parametrize("theme", ["vram-ansi", "vram-light", "vram-high-contrast"])
def test_main_screen_snapshot_in_other_themes(tmp_path, snap_compare, theme):
    assert settled_snapshot(tmp_path, snap_compare, (120, 40), theme=theme)


async def test_held_change_shows_rebuild_needed_and_R_rebuilds(tmp_path, session_factory):
    entry = write_project(tmp_path / "proj")
    session = session_factory(entry)
    app = make_app(session)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        assert session.wait_until_watching()
        entry.write_text(TRAIN.replace("model = torch.nn.Linear(4, 1)", "model = torch.nn.Linear(4, 1, bias=False)"))
        await until(pilot, lambda: "NEEDS REBUILD" in log_text(app), what="held change in the log")
        assert "setup() changed" in log_text(app)
        await until(pilot, lambda: "REBUILD NEEDED" in str(app.query_one(StatusBar).render()), what="status bar hint")

        await pilot.press("R")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="rebuild question")
        await pilot.press("escape")
        await pilot.pause(0.5)
        assert "REBUILT" not in log_text(app) and session.worker.user_state["model"].bias is not None, "esc cancels"
        await pilot.press("R")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="rebuild question")
        await pilot.press("y")
        await until(pilot, lambda: "REBUILT" in log_text(app), what="rebuild line")
        assert "carried 1 tensors" in log_text(app) and "dropped: model.bias" in log_text(app)
        await until(pilot, lambda: "REBUILD NEEDED" not in str(app.query_one(StatusBar).render()), what="hint cleared")
        assert session.worker.user_state["model"].bias is None


def test_memory_gauges_snapshot_with_a_fake_gpu(tmp_path, snap_compare):
    assert settled_snapshot(tmp_path, snap_compare, (120, 44))


async def test_sigterm_and_sighup_to_the_app_detach_and_training_goes_on(tmp_path, session_factory):
    """A closed terminal or a dropped SSH link ends the app only: the session is not stopped, nothing is written."""
    import os
    import signal

    session = session_factory(write_project(tmp_path / "proj"))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        app = make_app(session)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: session.status().step > 3, what="training")
            os.kill(os.getpid(), sig)  # the app's handler: detach (no question, no snapshot)
            await until(pilot, lambda: not app.is_running, what="app exit", timeout=10)
        before = session.status().step
        time.sleep(0.3)
        assert session.status().state == "running" and session.status().step > before, "the session stopped with its app"
    assert session.last_snapshot is None and session.worker.final_snapshot is None


async def test_a_session_that_ends_is_said_and_q_then_leaves_at_once(tmp_path, session_factory):
    """The time limit's final snapshot ends the session (another client's stop would too): the app says so and stays."""
    from dataclasses import replace

    from workbench.engine.time_limit import TimeLimit

    session = session_factory(write_project(tmp_path / "proj"))
    session.config = replace(session.config, time_limit=TimeLimit.after(14, "test limit"))
    session.worker.time_limit = session.config.time_limit
    app = make_app(session)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: session.ended is not None, what="the session's end at the time limit", timeout=20)
        await until(pilot, lambda: any("Session ended" in str(n.title) for n in app._notifications), what="the notice")
        assert app.is_running
        await pilot.press("q")  # nothing left to detach from or stop: no question
        await until(pilot, lambda: not app.is_running, what="app exit", timeout=5)
    session.close()
    assert session.worker.exit_reason == "time limit" and session.worker.final_snapshot.outcome == "written"


def test_help_screen_snapshot(tmp_path, snap_compare, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", "/home/you/.config")  # the help names the settings file
    entry = write_project(tmp_path / "snapshot_demo", DETERMINISTIC)
    session = new_session(entry, max_steps=5, probe=FakeDevice(), host_reader=frozen_host, watch=False)

    async def open_help(pilot) -> None:
        await until(pilot, lambda: session.status().state == "paused", what="5 steps")
        await pilot.press("question_mark")
        await until(pilot, lambda: help_shown(pilot.app), what="help")
        await pilot.pause(0.5)

    try:
        assert snap_compare(make_app(session, timestamps=False), terminal_size=(120, 44), run_before=open_help)
    finally:
        session.close()
