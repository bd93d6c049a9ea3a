"""bench/tui_cost.py's control-mode watcher, on a real tmux server: the key latency figures in
bench/RESULTS.md depend on it seeing each change the program in the pane makes, and only then."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)")

REPO = Path(__file__).resolve().parent.parent
# Answers each line typed into it, after a pause, so "seen" cannot come from the key's own echo.
ECHO_LATER = "import sys, time\nfor line in sys.stdin:\n    time.sleep(0.3)\n    print('answer:', line.strip()[::-1], flush=True)\n"


def load_tui_cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tui_cost", REPO / "bench" / "tui_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pane(tmp_path: Path, request: pytest.FixtureRequest):
    tui_cost = load_tui_cost()
    script = tmp_path / "program.py"
    script.write_text(getattr(request, "param", ECHO_LATER), encoding="utf-8")
    terminal = tui_cost.Tmux(tmp_path, tui_cost.make_env(tmp_path))
    try:
        terminal.start(tmp_path, [sys.executable, "-u", str(script)])
        watcher = tui_cost.ControlWatcher(terminal)
        try:
            yield tui_cost, watcher
        finally:
            watcher.close()
    finally:
        terminal.close()


def test_control_watcher_sees_the_programs_answer_when_it_comes(pane) -> None:
    tui_cost, watcher = pane
    started = time.perf_counter()
    watcher.send("abc", "Enter")
    screen, seen = watcher.wait_for(lambda s: "answer: cba" in s, 10.0, "the answer")
    assert "answer: cba" in screen
    # The program waits 0.3 s before it answers: a capture taken before the answer cannot pass.
    assert 0.3 <= seen - started < 5.0
    # Each capture went over the control connection, not a process: well under a process start.
    assert watcher.capture_seconds and min(watcher.capture_seconds) < 0.05


def test_control_watcher_gives_up_with_the_screen_when_nothing_changes(pane) -> None:
    tui_cost, watcher = pane
    with pytest.raises(tui_cost.BenchError, match="not on the screen after 1 s"):
        watcher.wait_for(lambda s: "never printed" in s, 1.0, "something never printed")


@pytest.mark.parametrize("pane", ["import time\nprint('bye')\ntime.sleep(0.5)\n"], indirect=True)
def test_control_watcher_says_when_the_program_is_gone(pane) -> None:
    tui_cost, watcher = pane
    started = time.perf_counter()
    with pytest.raises(tui_cost.BenchError, match="exited while waiting for something never printed"):
        watcher.wait_for(lambda s: "never printed" in s, 30.0, "something never printed")
    assert time.perf_counter() - started < 10  # not the whole timeout
