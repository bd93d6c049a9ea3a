"""`vram-bench serve NAME` end to end (issue 16, "Browser view"): a real detached session, the real
`python -m workbench serve` over TCP, the real app in headless Chromium.

The page shows the status bar's step counter moving; space in the page pauses the session itself
(its hello says paused, its log names the browser's app as the command's client); closing the
browser and stopping serve leave the session training.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("textual_serve", reason="textual-serve not installed (pip install 'vram-bench[serve]')")

from conftest import TRAIN_PY, make_project
from session_process_harness import Detached, Sessions, sessions_fixture, wait_until

from tests.test_serve import (
    CHROMIUM,
    CHROMIUM_ARGS,
    READ_SCREEN,
    STARTUP_TIMEOUT,
    Served,
    _expose_terminals,
    _read_lines,
)

sessions = pytest.fixture(sessions_fixture)


def _browser() -> tuple[object, str]:
    """Playwright's sync API and Chromium's path, or a skip saying which is missing."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright not installed (pip install playwright)")
    executable = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if executable is None:
        pytest.skip("Chromium not installed (apt-get install chromium)")
    return playwright_api, executable


def serve_session(live: Detached, cwd: Path) -> Served:
    """`python -m workbench serve NAME --host 127.0.0.1 --port 0` in the session's runtime folder, once it prints its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "serve", live.name, "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=live.env, cwd=cwd,
    )
    served = Served(proc)
    lines: queue.Queue[str | None] = queue.Queue()
    served.pending = lines
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        served.lines.append(line)
        if line.startswith("Press Ctrl+C"):
            return served
    served.stop()
    raise AssertionError("vram-bench serve did not print its URL in time:\n" + "\n".join(served.lines))


def _screen(page) -> str:  # type: ignore[no-untyped-def]
    return page.evaluate(READ_SCREEN) or ""


def _wait_screen(page, probe, timeout: float, what: str):  # type: ignore[no-untyped-def]
    """Poll `probe(screen)` until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe(_screen(page))
        if value is not None:
            return value
        time.sleep(0.2)
    raise AssertionError(f"waiting for {what}: not there after {timeout:.0f} s; the page's terminal shows:\n{_screen(page)}")


def _status_step(screen: str) -> int | None:
    """The step number in the app's status bar (`| step N `)."""
    found = re.findall(r"\| step (\d+)\b", screen)
    return int(found[-1]) if found else None


def _open_page(browser, served: Served):  # type: ignore[no-untyped-def]
    """A page on serve's URL (the token in it) whose terminal the test can read; once the status bar counts steps."""
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.route("**/static/js/textual.js", _expose_terminals)
    page.goto(served.url)
    first = _wait_screen(page, _status_step, 60, "the status bar's step counter")
    later = _wait_screen(page, lambda s: n if (n := _status_step(s)) is not None and n > first else None, 20,
                         f"the step counter to move past {first}")
    assert later > first
    return page


def _status(live: Detached) -> dict:
    """The session's status, from the hello of a fresh protocol client."""
    with live.connect() as client:
        status = client.hello["status"]
    live.clients.remove(client)
    return status


def _wait_others_attached(live: Detached, count: int, what: str, timeout: float = 15.0) -> None:
    """Until the session counts `count` clients besides a fresh one (its hello counts that one too).

    Probes are spaced: a client that just closed is counted until the session's reader sees it go.
    """
    deadline = time.monotonic() + timeout
    while (others := _status(live)["clients"] - 1) != count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: the session counts {others} other clients, not {count}")
        time.sleep(0.7)


def _steps(live: Detached) -> int:
    return sum(1 for m in live.logged() if m.get("event") == "step")


def _assert_detached_and_training(live: Detached, served: Served) -> None:
    """The browser's app detached (it said so on its way out) and the session still trains, with no client left."""
    assert any(f"detached; session {live.name} trains on" in line for line in served.lines), "\n".join(served.lines)
    assert live.alive(), "the session ended when the browser left"
    _wait_others_attached(live, 0, "the browser's app detached")
    with live.connect() as client:
        state = client.hello["status"]["state"]
        if state == "paused":
            client.send_line("resume")
        before = _steps(live)
        wait_until(lambda: _steps(live) > before + 3, 20, f"steps after leaving (the session was {state})")
    live.clients.remove(client)
    assert live.alive()


@pytest.mark.timeout(180)
def test_a_browser_shows_and_pauses_a_real_session_and_leaving_keeps_it_training(tmp_path: Path, sessions: Sessions) -> None:
    playwright_api, executable = _browser()
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    wait_until(lambda: _steps(live) > 0, 60, "the session's first step")

    served = serve_session(live, tmp_path)
    try:
        with playwright_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
            try:
                page = _open_page(browser, served)
                page.locator("body").click()  # the terminal takes the keys
                page.keyboard.press("Space")
                _wait_screen(page, lambda s: True if "PAUSED" in s else None, 20, "PAUSED in the status bar after space")

                status = _status(live)  # the session itself, not just the page, is paused
                assert status["state"] == "paused", status
                _wait_others_attached(live, 1, "the browser's app attached")
                def paused_by_the_app() -> bool:  # the session's log names the browser's app as the client
                    return any(m.get("event") == "command" and m.get("command") == "pause" and "app" in str(m.get("client"))
                               for m in live.logged())

                wait_until(paused_by_the_app, 10, "a pause command from the app in the session's log")
            finally:
                browser.close()
    finally:
        code = served.stop()
    assert code == 0, "\n".join(served.lines)
    _assert_detached_and_training(live, served)


@pytest.mark.timeout(180)
def test_ctrl_c_on_serve_with_a_browser_open_detaches_its_app(tmp_path: Path, sessions: Sessions) -> None:
    playwright_api, executable = _browser()
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    wait_until(lambda: _steps(live) > 0, 60, "the session's first step")

    served = serve_session(live, tmp_path)
    try:
        with playwright_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
            try:
                _open_page(browser, served)
                started = time.monotonic()
                code = served.stop()  # SIGINT while the page is open
                assert code == 0, "\n".join(served.lines)
                assert time.monotonic() - started < 5, "the app took the whole grace period: it did not quit when asked"
            finally:
                browser.close()
    finally:
        served.stop()
    _assert_detached_and_training(live, served)
