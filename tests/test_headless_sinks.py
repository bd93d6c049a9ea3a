"""A headless loop whose output goes nowhere (a session process, a rank > 0) does not queue telemetry.

Those processes run the headless loop only for its exit handling; their events reach events.jsonl (or the
socket) through other readers. Queueing every step for a printer that discards them cost a wakeup and a
queue entry per step beside the training loop.
"""

from __future__ import annotations

import io
import json

from conftest import TRAIN_PY, fast_config, make_project
from workbench.engine.project import load_project, unload_project
from workbench.engine.session import Session
from workbench.frontends.headless import run_headless


class Recording(io.StringIO):
    """Stands in for stdout; `lines` are what the loop wrote."""

    @property
    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.getvalue().splitlines() if line]


def _run(tmp_path, telemetry: bool) -> tuple[list[dict], list[dict]]:
    root = make_project(tmp_path, {"train.py": TRAIN_PY}, folder=f"proj-{telemetry}")
    project = load_project(root / "train.py", [])
    try:
        session = Session(project, fast_config(max_steps=6, memory_event_interval=0.2, write_event_log=True))
    except BaseException:
        unload_project(project)
        raise
    out = Recording()
    code = run_headless(session, out, None, telemetry=telemetry)
    assert code == 0
    logged = [json.loads(line) for line in (session.run_dir / "events.jsonl").read_text().splitlines()]
    return out.lines, logged


def test_without_telemetry_the_loop_writes_no_steps_but_the_event_log_has_them(tmp_path):
    written, logged = _run(tmp_path, telemetry=False)
    kinds = {e["event"] for e in written}
    assert "step" not in kinds and "memory" not in kinds
    assert {"start", "setup", "exit"} <= kinds  # everything else still passes: the exit ends the loop
    assert [e["step"] for e in logged if e["event"] == "step"] == [1, 2, 3, 4, 5, 6]


def test_with_telemetry_the_loop_writes_every_step(tmp_path):
    written, _ = _run(tmp_path, telemetry=True)
    assert [e["step"] for e in written if e["event"] == "step"] == [1, 2, 3, 4, 5, 6]
