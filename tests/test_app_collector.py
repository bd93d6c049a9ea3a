"""The app keeps Python's garbage collector off the path from a key to its frame (workbench/frontends/tui/collector.py).

Behaviour only; how fast the help appears is measured by `python bench/session_attach.py --only latency`.
An attached app freezes what it holds once it is up and gives it back when it leaves; an action holds
automatic collection until the screen shows what it did; a hold never outlives HOLD_MAX, the app,
or someone else's `gc.disable()`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conftest import TRAIN_PY, make_project
from session_process_harness import Sessions, sessions_fixture, until
from workbench.engine.project import load_project
from workbench.engine.session import Session, SessionConfig
from workbench.frontends.tui import collector
from workbench.frontends.tui.app import FREEZE_AFTER, make_app
from workbench.frontends.tui.widgets.help_panel import HelpPanel
from workbench.frontends.tui.widgets.status_bar import StatusBar
from workbench.protocol import registry
from workbench.protocol.remote import RemoteSession

pytestmark = pytest.mark.timeout(180)

sessions = pytest.fixture(sessions_fixture)


@pytest.fixture
def collector_as_usual() -> Iterator[None]:
    """Each test starts with automatic collection on and nothing frozen, and leaves it so."""
    collector.release()
    assert gc.isenabled()
    yield
    collector.release()
    gc.enable()


def tracked(obj: object) -> bool:
    """Whether collections walk `obj` (frozen objects are skipped, and not listed)."""
    return any(o is obj for o in gc.get_objects())


async def test_the_attached_app_freezes_what_it_holds_and_a_key_holds_collection_until_its_frame(
    tmp_path: Path, sessions: Sessions, collector_as_usual: None
) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    source = RemoteSession(registry.SessionEntry(live.name, live.socket, registry.read_facts(live.socket.with_suffix(".json"))))
    source.connect()
    app = make_app(source, timestamps=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "RUNNING" in str(app.query_one(StatusBar).render()), what="RUNNING")
        await until(pilot, lambda: gc.get_freeze_count() > 0, FREEZE_AFTER + 10, "the freeze once the app is up")
        panel = app.query_one(HelpPanel)
        assert not tracked(panel) and not tracked(source.telemetry), "what the app held when it froze is skipped"

        seen: dict[str, bool] = {}
        show, display = panel.show, app._display

        def show_and_look(keys: list[tuple[str, str]]) -> None:
            seen["collecting during the action"] = gc.isenabled()
            show(keys)

        def display_and_look(screen, renderable) -> None:  # once per composed screen update, as bench/session_attach.py sees frames
            display(screen, renderable)
            if renderable is not None and panel.shown and "collecting at its frame" not in seen:
                seen["collecting at its frame"] = gc.isenabled()

        panel.show = show_and_look  # type: ignore[method-assign]
        app._display = display_and_look  # type: ignore[method-assign]
        await pilot.press("question_mark")
        await until(pilot, lambda: "collecting at its frame" in seen, what="the frame with the help")
        await pilot.pause()
        assert seen == {"collecting during the action": False, "collecting at its frame": False}
        assert gc.isenabled(), "collection resumes once the frame is out"

        await pilot.press("escape")
        await pilot.press("d")  # detach: the app leaves while its action's hold is on
        await until(pilot, lambda: not app.is_running, 5, "detach")
    source.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0, "the app gave the collector back as it found it"


async def test_the_in_process_app_leaves_freezing_to_the_engine(tmp_path: Path, collector_as_usual: None) -> None:
    """In one process with the session, the engine freezes after setup() and releases when the session ends."""
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    session = Session(load_project(root / "train.py"), SessionConfig(device=torch.device("cpu"), exit_at_max_steps=False,
                                                                      freeze_gc=False))
    try:
        app = make_app(session, timestamps=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: session.status().step > 2, what="training")
            await pilot.pause(FREEZE_AFTER + 0.5)
            assert gc.get_freeze_count() == 0
            await pilot.press("question_mark")  # an action's hold works here too
            await until(pilot, lambda: app.query_one(HelpPanel).shown, what="the help")
            await pilot.pause()
            assert gc.isenabled()
            await pilot.press("d")
            await until(pilot, lambda: not app.is_running, 5, "detach")
    finally:
        session.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_turns_automatic_collection_off_until_released(collector_as_usual: None) -> None:
    hold = collector.CollectorHold(Clock())
    hold.hold()
    assert not gc.isenabled() and hold.holding
    assert gc.collect() >= 0, "an explicit collection still runs"
    hold.hold()  # a second action while held: still one hold
    hold.release()
    assert gc.isenabled() and not hold.holding
    hold.release()  # twice is harmless
    assert gc.isenabled()


def test_actions_back_to_back_let_the_due_collection_run_after_hold_max(collector_as_usual: None) -> None:
    clock = Clock()
    hold = collector.CollectorHold(clock)
    hold.hold()
    clock.now += collector.HOLD_MAX / 2
    hold.hold()
    assert not gc.isenabled()
    clock.now += collector.HOLD_MAX
    hold.hold()  # held for longer than HOLD_MAX: this action lets collection run
    assert gc.isenabled() and not hold.holding
    hold.hold()
    assert not gc.isenabled()
    hold.release()


def test_someone_elses_disable_is_theirs_to_undo(collector_as_usual: None) -> None:
    hold = collector.CollectorHold(Clock())
    gc.disable()
    try:
        hold.hold()
        hold.release()
        assert not gc.isenabled() and not hold.holding
    finally:
        gc.enable()


async def test_a_hold_lets_go_by_itself_after_hold_max(collector_as_usual: None) -> None:
    """An action that awaits, or a frame that never comes: the collector is back on HOLD_MAX after the hold began."""
    import asyncio

    hold = collector.CollectorHold()
    hold.hold()
    assert not gc.isenabled()
    await asyncio.sleep(collector.HOLD_MAX + 0.2)
    assert gc.isenabled() and not hold.holding
