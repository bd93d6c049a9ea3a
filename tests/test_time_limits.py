"""Job time limits: the final snapshot is written before the limit; SIGUSR1 snapshots, requeues and exits 0."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_project
from tests.process_output import finish
from tests.test_resume_faults import TRAIN_PY
from workbench.engine.actions.requeue import requeue_job
from workbench.engine.time_limit import TimeLimit, parse_duration, slurm_time_limit


def headless(entry: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(entry), "--headless", "--no-watch", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
    )


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def fake_scheduler(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """`scontrol` on PATH that records its arguments, and the environment of a Slurm job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol-calls"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_END_TIME": ""}
    return env, calls


def test_time_limit_writes_the_final_snapshot_before_it_and_exits_0(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    started = time.monotonic()
    proc = headless(root / "train.py", "--time-limit", "25s")
    out, err = proc.communicate(timeout=120)
    ended = time.monotonic() - started
    events = events_of(out)
    assert proc.returncode == 0, err
    final = [e for e in events if e["event"] == "snapshot" and e["reason"] == "final"]
    assert len(final) == 1 and Path(final[0]["path"]).is_file()
    said = [e for e in events if e["event"] == "error" and e["where"] == "time limit"]
    assert said and "--time-limit 25 s" in said[0]["message"] and "writing it and exiting" in said[0]["message"]
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "time limit" and events[-1]["code"] == 0
    assert ended < 25, f"exited {ended:.1f} s after start: after the limit the scheduler would have killed it"
    assert final[0]["step"] == events[-1]["step"] > 10, "it trained until close to the limit"
    assert "final snapshot of step" in err


def test_the_requeue_signal_snapshots_requeues_the_slurm_job_and_exits_0(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    env, calls = fake_scheduler(tmp_path)
    proc = headless(root / "train.py", "--requeue", env=env)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if json.loads(line)["event"] == "step":
                break
        proc.send_signal(signal.SIGUSR1)
        out, err = finish(proc, timeout=60)  # with the lines the loop's reader had buffered
    finally:
        if proc.poll() is None:
            proc.kill()
    events = events_of(out)
    assert proc.returncode == 0, err
    assert [e["reason"] for e in events if e["event"] == "snapshot"] == ["final"]
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "requeue signal"
    assert calls.read_text().split() == ["requeue", "4242"], "scontrol requeue was not called for the job"
    assert any(e.get("where") == "requeued" and "requeued Slurm job 4242" in e["message"] for e in events)


def test_requeue_outside_slurm_or_when_scontrol_fails_says_so() -> None:
    done, sentence = requeue_job({})
    assert not done and "not running under Slurm" in sentence
    failing = lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "slurm_requeue error: Job is not requeueable\n")  # noqa: E731
    done, sentence = requeue_job({"SLURM_JOB_ID": "7"}, run=failing)
    assert not done and "Job is not requeueable" in sentence and "not requeued" in sentence


@pytest.mark.parametrize(
    "text, seconds",
    [("3h50m", 13800), ("90m", 5400), ("20s", 20), ("45", 45), ("1d2h", 93600), ("01:30:00", 5400), ("2-00:00:10", 172810)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "3x", "h"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_a_bad_time_limit_is_a_one_line_error(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--time-limit", "soon"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--time-limit" in proc.stderr and "is not a duration" in proc.stderr


def test_the_slurm_jobs_end_comes_from_its_environment_or_squeue() -> None:
    in_an_hour = time.time() + 3600
    limit = slurm_time_limit({"SLURM_JOB_ID": "9", "SLURM_JOB_END_TIME": str(int(in_an_hour))})
    assert limit is not None and 3590 < limit.remaining() <= 3600 and "Slurm job 9 ends at" in limit.source
    asked = []

    def squeue(command, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(command)
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(in_an_hour))
        return subprocess.CompletedProcess(command, 0, end + "\n", "")

    limit = slurm_time_limit({"SLURM_JOB_ID": "9"}, run=squeue)
    assert asked == [["squeue", "-h", "-j", "9", "-o", "%e"]] and limit is not None and 3580 < limit.remaining() <= 3600
    assert slurm_time_limit({}) is None


def test_the_snapshot_is_due_when_the_time_left_is_what_a_snapshot_takes() -> None:
    limit = TimeLimit.after(60, "test")
    assert not limit.snapshot_due(snapshot_seconds=5, state_bytes=0, slowest_step_seconds=1)
    assert limit.snapshot_due(snapshot_seconds=40, state_bytes=0, slowest_step_seconds=1)  # 1.5 x 40 + margin > 60
    assert limit.snapshot_due(snapshot_seconds=None, state_bytes=6_000_000_000, slowest_step_seconds=0)  # ~60 s to write


def test_resume_auto_starts_fresh_without_a_snapshot_and_resumes_the_latest_with_one(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    command = [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--no-watch",
               "--resume", "auto", "--max-steps", "3"]
    first = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert first.returncode == 0 and "no snapshot yet, so this run starts fresh" in first.stderr, first.stderr
    assert not [e for e in events_of(first.stdout) if e["event"] == "resume"]
    from tests.conftest import is_event, open_session
    from tests.test_resume_faults import take_snapshot

    with open_session(root / "train.py", max_steps=4, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        snap = Path(take_snapshot(live).path)
    second = subprocess.run([*command[:-1], "6"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    resumed = [e for e in events_of(second.stdout) if e["event"] == "resume"]
    assert second.returncode == 0 and resumed and resumed[0]["ok"] and resumed[0]["path"] == str(snap), second.stderr
