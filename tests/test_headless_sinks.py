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


def test_the_exit_is_the_last_line_of_the_stream_and_of_the_event_log(tmp_path):
    # Events queued behind the exit (a memory sample taken while the session closes) are not written after it:
    # a reader stops at `exit`, and a script checking `lines[-1]` sees why the run ended.
    from workbench.engine.eventlog import EventLogWriter
    from workbench.protocol.eventbus import EventBus, write_until_exit
    from workbench.protocol.events import Exit, Step

    late = Step(step=3, loss=1.0, ms=1.0)
    out = Recording()
    assert not write_until_exit([Step(step=1, loss=1.0, ms=1.0)], out)
    assert write_until_exit([Step(step=2, loss=1.0, ms=1.0), Exit(reason="max steps", step=2), late], out)
    assert [e["event"] for e in out.lines] == ["step", "step", "exit"]

    bus = EventBus()  # a plain bus: the writer itself must stop at the exit
    writer = EventLogWriter(bus, tmp_path / "events.jsonl")
    for event in (Step(step=1, loss=1.0, ms=1.0), Exit(reason="max steps", step=1), late):
        bus.publish(event)
    writer.start()
    writer.join(5)
    assert not writer.is_alive()
    logged = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert logged == ["step", "exit"]


def test_a_real_runs_stream_ends_with_its_exit(tmp_path):
    written, logged = _run(tmp_path, telemetry=True)
    assert written[-1]["event"] == "exit" and logged[-1]["event"] == "exit"
    assert sum(e["event"] == "exit" for e in written) == 1
