"""The run's event log survives a write that fails, and says what it lacks (workbench/engine/eventlog.py).

Before, a full disk or a run folder that was no longer a folder ended the writer thread with a traceback on stderr
(a detached session's log file, which nobody reads): `events.jsonl` stopped and nothing said so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from workbench.engine.eventlog import EventLogWriter
from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import Error, Exit, Step


def _errors_until(subscription, count: int, timeout: float = 10.0) -> list[Error]:
    """The writer's warnings, read from the bus as a front end would, until `count` arrived."""
    found: list[Error] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += [e for e in subscription.wait(0.2) if isinstance(e, Error)]
    assert len(found) >= count, f"expected {count} warnings, saw {found}"
    return found


def test_a_folder_that_cannot_hold_the_log_is_said_once_and_the_log_goes_on_when_it_can(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.write_text("a file where the run folder should be")
    bus = EventBus()
    front = bus.subscribe()
    writer = EventLogWriter(bus, run_dir / "events.jsonl")
    writer.start()
    try:
        for n in range(1, 4):
            bus.publish(Step(step=n, loss=1.0, ms=1.0))
        (failed,) = _errors_until(front, 1)
        assert failed.where == "run folder" and failed.is_warning, failed
        assert failed.message.startswith(f"cannot write the run's event log {run_dir / 'events.jsonl'} (")
        assert "training goes on" in failed.message
        for n in range(4, 6):
            bus.publish(Step(step=n, loss=1.0, ms=1.0))
        time.sleep(1.2)  # more batches fail: still one warning
        assert not [e for e in front.drain() if isinstance(e, Error)], "a failure is said once, not every batch"

        run_dir.unlink()
        run_dir.mkdir()
        bus.publish(Step(step=6, loss=1.0, ms=1.0))
        (back,) = _errors_until(front, 1)
        assert back.where == "run folder" and "is written again: " in back.message, back
        missing = int(back.message.split("is written again: ")[1].split(" events")[0])
        assert missing >= 6, back.message  # steps 1-5 and the first warning at least
        bus.publish(Exit(reason="quit", step=6))
        writer.join(5)
        assert not writer.is_alive(), "the writer ends at the exit, as before"
    finally:
        writer.stop()
    logged = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in logged][-1] == "exit"
    assert any(e["event"] == "step" and e["step"] == 6 for e in logged)
    assert any(e["event"] == "error" and "is written again" in e["message"] for e in logged)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_does_not_end_the_writer_and_the_exit_still_ends_it() -> None:
    bus = EventBus()
    front = bus.subscribe()
    writer = EventLogWriter(bus, Path("/dev/full"))  # every write: ENOSPC, as a full disk gives
    writer.start()
    bus.publish(Step(step=1, loss=1.0, ms=1.0))
    (failed,) = _errors_until(front, 1)
    assert "No space left on device" in failed.message, failed.message
    assert writer.is_alive(), "a failed write does not end the log's thread"
    bus.publish(Exit(reason="quit", step=1))
    writer.join(5)
    assert not writer.is_alive(), "the exit ends it even when it cannot be written"


def test_half_a_line_left_by_a_failed_write_does_not_spoil_the_next_event(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event":"step","step":1}\n{"event":"st')  # a write cut short
    bus = EventBus()
    writer = EventLogWriter(bus, path)
    writer.start()
    bus.publish(Step(step=2, loss=1.0, ms=1.0))
    bus.publish(Exit(reason="quit", step=2))
    writer.join(5)
    lines = path.read_text().splitlines()
    assert lines[1] == '{"event":"st' and json.loads(lines[2])["step"] == 2 and json.loads(lines[3])["event"] == "exit"
