"""The versions table: one row per applied code version, its figures, and the change against the previous one."""

from __future__ import annotations

import csv
import json

import torch

from tests.conftest import is_event, save
from tests.test_tui import log_text, session_factory, until, write_project  # noqa: F401 - fixture
from workbench.frontends.tui.app import make_app
from workbench.engine.versions import describe_delta

TRAIN_PY = """\
import time
import torch

WIDTH = 64


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.001)}


def step(state, bench):
    time.sleep(0.002)
    x = torch.randn(WIDTH, 32)
    loss = state["model"](x).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def test_delta_names_what_changed_and_by_how_much():
    before = {"saved_bytes_per_step": 1000, "median_step_ms": 10.0, "peak_allocated": None, "mean_loss": 2.0}
    after = {"saved_bytes_per_step": 620, "median_step_ms": 11.2, "peak_allocated": None, "mean_loss": 2.0}
    assert describe_delta(before, after) == "-38% saved activations, +12% step time"
    assert describe_delta({"saved_bytes_per_step": 50}, {"saved_bytes_per_step": 55_000}) == "x1100 saved activations"


def test_three_saves_give_four_rows_with_their_own_figures(start_session, tmp_path):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(5)
    for version, width in enumerate((128, 32, 16), start=1):
        save(live.entry, TRAIN_PY.replace("WIDTH = 64", f"WIDTH = {width}"))
        live.wait_for(is_event("reload", code_version=version), timeout=15)
        live.events.steps(5, lambda e, v=version: e.code_version == v)
    rows = live.session.telemetry.versions.rows()
    assert [r["version"] for r in rows] == [0, 1, 2, 3]
    assert [r["changed"] for r in rows[1:]] == [("WIDTH",)] * 3
    assert all(r["steps"] >= 5 and r["median_step_ms"] > 0 for r in rows)
    saved = [r["saved_bytes_per_step"] for r in rows]
    # Activations saved for backward scale with the batch: 64 -> 128 -> 32 -> 16 rows.
    assert saved[1] > saved[0] > saved[2] > saved[3] > 0, saved
    assert rows[2]["delta"].startswith("-") and "saved activations" in rows[2]["delta"], rows[2]["delta"]

    json_path = live.session.telemetry.versions.export(tmp_path / "out", "json")
    assert [r["version"] for r in json.loads(json_path.read_text())] == [0, 1, 2, 3]
    csv_path = live.session.telemetry.versions.export(tmp_path / "out", "csv")
    with csv_path.open() as f:
        assert [row["changed"] for row in csv.DictReader(f)] == ["", "WIDTH", "WIDTH", "WIDTH"]


async def test_versions_screen_shows_rows_and_exports(tmp_path, session_factory):
    entry = write_project(tmp_path / "proj")
    session = session_factory(entry)
    app = make_app(session)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        assert session.wait_until_watching()
        entry.write_text(entry.read_text().replace("TAG = 1.0", "TAG = 2.0"))
        await until(pilot, lambda: session.status().code_version == 1, what="reload")
        await pilot.press("v")
        await until(pilot, lambda: type(app.screen).__name__ == "VersionsScreen", what="versions screen")
        await pilot.press("j")
        await until(pilot, lambda: bool(list((session.run_dir).glob("versions-*.json"))), what="export")
        rows = json.loads(next((session.run_dir).glob("versions-*.json")).read_text())
        assert [r["changed"] for r in rows] == [[], ["TAG"]]


async def test_profile_table_opens_in_the_app(tmp_path, session_factory):
    import io

    from rich.console import Console

    session = session_factory(write_project(tmp_path / "proj"))
    app = make_app(session)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: session.status().step > 3, what="training")
        await pilot.press("p")
        await until(pilot, lambda: session.last_profile is not None, what="profile", timeout=30)
        await pilot.press("o")
        await until(pilot, lambda: type(app.screen).__name__ == "ProfileScreen", what="profile screen")
        console = Console(width=140, record=True, file=io.StringIO())
        for widget in app.screen.query("Static"):
            console.print(widget.content)
        text = console.export_text()
        assert "aten::" in text and "self CPU ms" in text and ".json.gz" in text


def test_measuring_saved_bytes_never_keeps_a_dropped_graph_alive():
    """relu saves its own output: a pack hook returning that tensor as-is would make a cycle gc cannot see."""
    import gc
    import weakref

    from workbench.engine.saved_bytes import SavedBytes

    x = torch.randn(64, 64, requires_grad=True)
    with SavedBytes({}) as measured:
        y = torch.relu(x)
        loss = y.sum()
    assert measured.bytes >= 64 * 64 * 4
    alive = weakref.ref(y)
    del y, loss
    gc.collect()
    assert alive() is None, "the graph was dropped without backward and must be freed"
    with SavedBytes({}):
        z = torch.tanh(x)
    z.sum().backward()
    assert torch.allclose(x.grad, 1 - torch.tanh(x).detach() ** 2), "gradients are unchanged"
