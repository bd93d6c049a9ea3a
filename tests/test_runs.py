"""Run folders: every session writes its own `.vram-bench/runs/<start>/`; runs never overwrite or prune each other,
`--resume latest` is chosen by run and step, and a run that trained nothing writes no snapshot."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import is_event, make_project, open_session
from tests.process_output import finish
from tests.test_resume_faults import TRAIN_PY, take_snapshot
from workbench.engine.actions.snapshot import find_snapshot, load_snapshot, write_snapshot
from workbench.protocol.events import Resume, TakeSnapshot
from workbench.engine.runs import latest_snapshot, list_runs, read_record


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_until_paused_at(entry: Path, steps: int, **config):  # type: ignore[no-untyped-def]
    """A session paused after exactly `steps` steps (a context manager)."""
    return open_session(entry, max_steps=steps, exit_at_max_steps=False, **config)


def test_each_session_writes_its_own_run_and_never_overwrites_or_prunes_another(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with run_until_paused_at(root / "train.py", 6, snapshot_keep=2) as first:
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        a = take_snapshot(first)
        first_run = first.session.run_dir
    kept = {p: digest(p) for p in (first_run / "snapshots").glob("step-*.pt")}
    assert [p.name for p in kept] == ["step-00000006.pt"]

    with run_until_paused_at(root / "train.py", 6, snapshot_keep=1) as second:
        second.wait_for(is_event("paused", reason="max steps"), timeout=30)
        b = take_snapshot(second)  # the same step number as the first run's file
        second.session.worker.max_steps = 8
        second.send(Resume())
        second.wait_for(is_event("paused", reason="max steps"), timeout=30)
        take_snapshot(second)  # keep=1: prunes its own step 6, never the first run's
        second_run = second.session.run_dir

    assert second_run != first_run and second_run.parent == first_run.parent == root.resolve() / ".vram-bench" / "runs"
    assert Path(b.path).parent.parent == second_run and not Path(b.path).exists(), "pruned within its own run"
    assert {p: digest(p) for p in (first_run / "snapshots").glob("step-*.pt")} == kept, "the first run's file was touched"
    assert Path(a.path).exists()
    records = {run.name: run for run in list_runs(root / ".vram-bench")}
    assert records[second_run.name].steps == 8 and records[first_run.name].steps == 6
    assert records[second_run.name].last_loss is not None and records[second_run.name].exit_reason == "quit"
    assert [s.step for s in records[second_run.name].snapshots] == [8]


def test_resume_latest_is_the_newest_runs_highest_step_never_the_newest_file(tmp_path) -> None:
    state = tmp_path / ".vram-bench"
    model = {"model": __import__("torch").nn.Linear(2, 2)}
    legacy = state / "snapshots"
    write_snapshot(model, 900, 0, state)  # the shared folder of versions before run folders
    assert find_snapshot(state, "latest") == legacy / "step-00000900.pt", "old snapshots keep working for --resume"

    older, newer = state / "runs" / "2026-01-01T10-00-00", state / "runs" / "2026-01-01T10-00-00-2"
    for step in (100, 300):
        write_snapshot(model, step, 0, older)
    for step in (50, 120):
        write_snapshot(model, step, 0, newer)
    (newer / "snapshots" / ".tmp-1-x.pt").write_bytes(b"half")  # a temp file is never a candidate
    future = time.time() + 3600
    for path in (older / "snapshots" / "step-00000300.pt", legacy / "step-00000900.pt"):
        os.utime(path, (future, future))  # copied or touched later: not newer training
    assert latest_snapshot(state) == newer / "snapshots" / "step-00000120.pt"
    assert find_snapshot(state, "latest") == newer / "snapshots" / "step-00000120.pt"


def test_a_resumed_session_writes_its_own_run_and_leaves_the_branch_it_came_from(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with run_until_paused_at(root / "train.py", 4) as first:
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        branch_point = Path(take_snapshot(first).path)
        first.session.worker.max_steps = 8
        first.send(Resume())
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        original = Path(take_snapshot(first).path)
    original_digest = digest(original)

    with run_until_paused_at(root / "train.py", 8, resume=branch_point) as resumed:
        resumed.wait_for(is_event("resume", ok=True), timeout=30)
        resumed.wait_for(is_event("paused", reason="max steps"), timeout=30)
        branch = Path(take_snapshot(resumed).path)
        resumed_run = resumed.session.run_dir

    assert branch.name == original.name == "step-00000008.pt" and branch != original
    assert branch.parent.parent == resumed_run
    assert digest(original) == original_digest, "the resumed session overwrote the original run's step 8"
    assert load_snapshot(original)["step"] == load_snapshot(branch)["step"] == 8
    assert read_record(resumed_run)["resumed_from"] == str(branch_point)


SLOW_SETUP = TRAIN_PY.replace("def setup(bench):\n", "def setup(bench):\n    time.sleep(3)\n")


def test_sigterm_during_a_slow_setup_writes_no_snapshot_of_the_untrained_model(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with run_until_paused_at(root / "train.py", 3) as trained:
        trained.wait_for(is_event("paused", reason="max steps"), timeout=30)
        good = Path(take_snapshot(trained).path)
    (root / "train.py").write_text(SLOW_SETUP)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--no-watch"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    while line and '"setup"' not in line:
        line = proc.stdout.readline()  # type: ignore[union-attr]
    assert json.loads(line)["status"] == "running"
    proc.send_signal(signal.SIGTERM)  # mid-setup: the untrained model must not become the "latest" snapshot
    out, err = finish(proc, timeout=60)
    events = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert proc.returncode == 0, err
    assert not [e for e in events if e["event"] == "snapshot"], "a snapshot of the untrained model was written"
    assert "no final snapshot: no step ran" in err
    assert find_snapshot(root / ".vram-bench", "latest") == good, "--resume latest would start over"


def test_s_before_the_first_step_is_refused_with_the_reason(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY}, start_paused=True)
    live.wait_for(is_event("paused", reason="user"), timeout=30)
    live.send(TakeSnapshot())
    refused = live.wait_for(is_event("error", where="command"), timeout=10)
    assert "no snapshot before the first step" in refused.message
    assert not list((live.session.run_dir / "snapshots").glob("*.pt"))


def test_vram_bench_runs_lists_each_run_with_its_steps_versions_loss_and_snapshots(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with run_until_paused_at(root / "train.py", 5) as first:
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        snap = Path(take_snapshot(first).path)
        first_run = first.session.run_dir
    with run_until_paused_at(root / "train.py", 7, resume=snap) as second:
        second.wait_for(is_event("paused", reason="max steps"), timeout=30)
        take_snapshot(second)
        second_run = second.session.run_dir
    killed = root / ".vram-bench" / "runs" / "2020-01-01T00-00-00"
    killed.mkdir()
    (killed / "run.json").write_text(json.dumps({"started": 1577836800.0, "pid": 2**22 + 12345, "step": 40, "ended": None}))

    proc = subprocess.run([sys.executable, "-m", "workbench", "runs", str(root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line and not line.startswith(" ")}
    assert list(rows) == [second_run.name, first_run.name, killed.name], proc.stdout
    assert rows[second_run.name].split()[3:7] == ["quit", "7", "v0", rows[second_run.name].split()[6]]
    assert "1, newest step 7" in rows[second_run.name] and "1, newest step 5" in rows[first_run.name]
    assert "killed" in rows[killed.name] and "40" in rows[killed.name]
    assert f"{second_run.name} resumed from {snap}" in proc.stdout
    float(rows[first_run.name].split()[6])  # the last loss, a number

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "workbench", "runs", str(empty)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "has no runs yet" in proc.stderr
