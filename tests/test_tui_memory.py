"""Memory screens on a real session: breakdown (b), leak finder (t), CUDA memory snapshot (m) on CPU."""

from __future__ import annotations

import io

from rich.console import Console

from tests.test_tui import TRAIN, log_text, session_factory, until, write_project  # noqa: F401 - fixture
from workbench.frontends.tui.app import make_app

LEAKY = TRAIN.replace("TAG = 1.0\n", "TAG = 1.0\nLOSSES = []\n").replace(
    '    return {"loss"', '    LOSSES.append(loss)  # the bug: every loss kept with its graph\n    return {"loss"'
)


def screen_text(app) -> str:
    console = Console(width=140, record=True, file=io.StringIO())
    for widget in app.screen.query("#report"):
        console.print(widget.content)
    return console.export_text()


async def test_breakdown_screen_shows_exact_parts_and_advice(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        await pilot.press("b")
        await until(pilot, lambda: "parameters" in screen_text(app), what="breakdown")
        text = screen_text(app)
        # Linear(4, 1): 5 float32 parameters = 20 B; SGD without momentum keeps no state.
        assert "parameters" in text and "20 B" in text
        assert "activations" in text and "n/a" in text
        await pilot.press("escape")
        await until(pilot, lambda: type(app.screen).__name__ == "Screen", what="back to the main screen")


async def test_leak_finder_names_the_list_that_keeps_losses_alive(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj", LEAKY))
    app = make_app(session)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 20, what="training")
        await pilot.press("t")
        await until(pilot, lambda: "Suspects" in screen_text(app), what="leak report", timeout=30)
        text = screen_text(app)
        first = text[text.index("1. "):].splitlines()
        assert "grad_fn" in first[0] or "requires_grad" in first[0], first[0]
        assert "LOSSES" in " ".join(first[:3]), first[:3]


async def test_memory_snapshot_on_cpu_explains_it_needs_cuda(tmp_path, session_factory):
    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: session.status().step > 1, what="training")
        await pilot.press("m")
        await until(pilot, lambda: "need a CUDA device" in log_text(app), what="explanation")
