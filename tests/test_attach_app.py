"""The app as a client: a real session process, its real socket, the real Textual app (run_test) on a RemoteSession.

What a user sees after attaching: the history drawn at once, keys that act on the session and
show it, other clients counted, a detach that leaves training going, and a session that dies said plainly.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import TRAIN_PY, make_project
from session_process_harness import Sessions, sessions_fixture, until, wait_until
from workbench.protocol.remote import RemoteSession
from workbench.protocol import registry
from workbench.frontends.tui.app import make_app
from workbench.frontends.tui.widgets.reload_log import ReloadLog
from workbench.frontends.tui.widgets.status_bar import StatusBar

pytestmark = pytest.mark.timeout(180)

sessions = pytest.fixture(sessions_fixture)


def remote(live) -> RemoteSession:
    return RemoteSession(registry.SessionEntry(live.name, live.socket, registry.read_facts(live.socket.with_suffix(".json"))))


def status_text(app) -> str:
    return str(app.query_one(StatusBar).render())


def log_text(app) -> str:
    return "\n".join(strip.text for strip in app.query_one(ReloadLog).lines)


async def test_attach_late_draws_the_history_and_keys_act_on_the_session(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    wait_until(lambda: sum(1 for m in live.logged() if m.get("event") == "step") >= 40, 30, "40 steps before attaching")
    source = remote(live)
    source.connect()
    replayed = {s.name: len(s.steps) for s in source.telemetry.series()}
    assert replayed.get("loss", 0) >= 40, replayed  # the chart's history came with the hello
    app = make_app(source, timestamps=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "RUNNING" in status_text(app), what="RUNNING")
        await until(pilot, lambda: "START" in log_text(app) and "SETUP" in log_text(app), what="the log's history")
        first = source.status().step
        await until(pilot, lambda: source.status().step > first + 3, what="steps counting on")
        await pilot.press("space")
        await until(pilot, lambda: "PAUSED" in status_text(app), what="PAUSED after space")
        paused_at = source.status().step
        await pilot.press("n")
        await until(pilot, lambda: source.status().step == paused_at + 1, what="one step after n")
        await until(pilot, lambda: "COMMAND pause from client" in log_text(app), what="this app's own command in the log")
        other = live.connect("second terminal")
        await until(pilot, lambda: "2 attached" in status_text(app), what="two clients counted")
        other.send_line("resume")  # a command from another client: this app sees it happen
        await until(pilot, lambda: "RUNNING" in status_text(app), what="RUNNING after the other client's resume")
        await until(pilot, lambda: "second terminal" in log_text(app), what="the log naming the other client")
        for key in ("question_mark", "escape", "z", "z"):  # client-only keys: nothing crosses the socket
            await pilot.press(key)
        await pilot.pause(0.5)
        sent = [m["command"] for m in live.logged() if m.get("event") == "command"]
        assert sent == ["pause", "step", "resume"], sent
        await pilot.press("d")
        await until(pilot, lambda: not app.is_running, what="detach", timeout=5)
    source.close()
    before = max(m["step"] for m in live.logged() if m.get("event") == "step")
    wait_until(lambda: max(m["step"] for m in live.logged() if m.get("event") == "step") > before + 3, 15,
               "training after the detach")
    assert live.alive()


async def test_a_killed_session_is_said_within_two_seconds_with_its_snapshot_and_the_resume_command(
    tmp_path: Path, sessions: Sessions
) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    source = remote(live)
    source.connect()
    app = make_app(source, timestamps=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "RUNNING" in status_text(app), what="RUNNING")
        await pilot.press("s")
        await until(pilot, lambda: source.status().last_snapshot is not None, what="a snapshot")
        snapshot = source.status().last_snapshot
        killed = time.monotonic()
        os.kill(live.pid, signal.SIGKILL)
        await until(pilot, lambda: "session died" in log_text(app), timeout=5, what="the death in the log")
        assert time.monotonic() - killed < 2.0
        said = log_text(app)
        assert Path(snapshot).name in said and "--resume latest" in said
        assert source.ended is not None
        await pilot.press("q")  # nothing to detach from: q leaves at once
        await until(pilot, lambda: not app.is_running, what="exit", timeout=5)


async def test_q_then_s_stops_the_session_after_a_final_snapshot_and_the_app_leaves(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    source = remote(live)
    source.connect()
    app = make_app(source, timestamps=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: source.status().step > 3, what="training")
        await pilot.press("q")
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmQuitScreen", what="the question")
        await pilot.press("s")
        await until(pilot, lambda: not app.is_running, what="the app leaving once the session ended", timeout=30)
    assert source.exit_code == 0 and source.final_snapshot is not None
    assert Path(source.final_snapshot.path).is_file()
    wait_until(lambda: not live.alive(), 10, "the session's end")
    final = [m for m in live.logged() if m.get("event") == "snapshot"][-1]
    assert final["reason"] == "final" and final["path"] == source.final_snapshot.path


def test_a_dropped_link_reconnects_by_itself_while_the_session_lives(tmp_path: Path, start_session) -> None:
    """The link drops (the session ends this client's connection; an SSH forward that hiccups looks the same):
    the client says so, connects again, and keeps following the session."""
    import tempfile

    from workbench.engine.session_server import SessionServer

    live = start_session()
    live.wait_running()
    folder = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
    server = SessionServer(live.session, folder / "s.sock", facts={"name": "s", "pid": os.getpid()})
    server.start()
    try:
        source = RemoteSession(registry.SessionEntry("s", folder / "s.sock", None), reconnect_for=10.0)
        log = source.bus.subscribe()
        source.start()
        wait_until(lambda: source.status().step > 0, 10, "a status frame")
        for client in server.clients():
            client.close()  # the link drops
        said: list[str] = []

        def reconnected() -> bool:
            said.extend(e.message for e in log.drain() if e.name == "error")
            return any("restored" in m for m in said)

        wait_until(reconnected, 15, "the reconnection")
        assert any("dropped" in m for m in said), said
        assert max(source.telemetry.series()[0].steps) > 0
        step = source.status().step
        wait_until(lambda: source.status().step > step + 3, 15, "the status following the session again")
        assert source.ended is None
        source.close()
    finally:
        server.close()
