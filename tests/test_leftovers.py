"""Temp files a writer killed mid-snapshot left behind are removed at the next start, and said; others are kept."""

from __future__ import annotations

import subprocess
import sys

from conftest import TRAIN_PY, is_event, make_project, open_session


def test_a_killed_writers_temp_file_is_removed_at_the_next_start_and_others_are_kept(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    snapshots = root / ".vram-bench" / "snapshots"
    snapshots.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a process that has ended: its pid runs nothing now
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = snapshots / f".tmp-{dead_pid}-k3j2.pt"
        left.write_bytes(b"\0" * 3000)
        writing = snapshots / f".tmp-{alive.pid}-a8b9.pt"  # another session, still writing
        writing.write_bytes(b"\0" * 10)
        older = snapshots / ".tmp-x81lq.pt"  # from a version that did not name its writer: cannot tell
        older.write_bytes(b"\0" * 10)
        mine = snapshots / "step-00000010.pt"
        mine.write_bytes(b"\0" * 10)
        earlier_run = root / ".vram-bench" / "runs" / "2026-01-01T00-00-00"
        (earlier_run / "snapshots").mkdir(parents=True)
        in_a_run = earlier_run / "snapshots" / f".tmp-{dead_pid}-q1.pt"  # a run folder's writer, killed
        in_a_run.write_bytes(b"\0" * 100)
        record = earlier_run / f".tmp-{dead_pid}-r2.json"  # killed while updating run.json
        record.write_text("{")
        with open_session(root / "train.py") as live:
            said = live.wait_for(is_event("error", where="run folder"))
            assert str(left) in said.message and f"pid {dead_pid}" in said.message and "2.93 KiB" in said.message, said
            assert said.is_warning
            live.wait_running(1)
            messages = [e.message for e in live.events.of("error") if e.where == "run folder"]
        assert any(str(in_a_run) in m for m in messages) and any(str(record) in m for m in messages), messages
        assert not left.exists() and not in_a_run.exists() and not record.exists()
        assert writing.exists() and older.exists() and mine.exists()
    finally:
        alive.kill()
        alive.wait()


def test_snapshot_temp_files_carry_their_writers_pid() -> None:
    import os

    from workbench.engine.actions.leftovers import temp_prefix

    assert temp_prefix() == f".tmp-{os.getpid()}-"
