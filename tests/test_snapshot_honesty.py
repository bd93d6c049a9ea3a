"""Snapshots never claim what did not happen: a failed final snapshot says so and exits non-zero, a damaged
file is refused with the previous one offered, a full disk is said in words (real mounts where the machine allows)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import is_event, make_project
from tests.process_output import finish
from tests.test_resume_faults import TRAIN_PY, take_snapshot

BIG_TRAIN_PY = TRAIN_PY.replace("torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)",
                                "torch.nn.Linear(4, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.Linear(512, 1)")


def _run(*command: str) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


@contextlib.contextmanager
def mounted(*how: str, at: Path) -> Iterator[None]:
    """A real mount for the test's life (root only; skipped where the machine does not allow it)."""
    at.mkdir(parents=True, exist_ok=True)
    if not _run("mount", *how, str(at)):
        pytest.skip(f"cannot mount {' '.join(how)} here (needs root)")
    try:
        yield
    finally:
        _run("umount", "-l", str(at))


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` made read-only for everyone, root included: a read-only bind mount over itself."""
    with mounted("--bind", str(folder), at=folder):
        if not _run("mount", "-o", "remount,bind,ro", str(folder)):
            pytest.skip("cannot remount read-only here")
        yield


def headless(entry: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(entry), "--headless", "--no-watch", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )


def read_until(proc: subprocess.Popen[str], event: str) -> dict:
    while True:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the process ended before a {event} event: {proc.stderr.read()}"  # type: ignore[union-attr]
        parsed = json.loads(line)
        if parsed["event"] == event:
            return parsed


def test_sigterm_with_snapshots_failing_says_the_final_one_failed_names_the_last_good_and_exits_1(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    proc = headless(root / "train.py")
    try:
        read_until(proc, "step")
        proc.stdin.write("snapshot\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        good = read_until(proc, "snapshot")
        folder = Path(good["path"]).parent
        with read_only(folder):
            for _ in range(5):
                read_until(proc, "step")
            proc.send_signal(signal.SIGTERM)
            out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert proc.returncode == 1, err
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "final snapshot failed" and events[-1]["code"] == 1
    assert "written to" not in err
    last = [line for line in err.splitlines() if "final snapshot" in line][-1]
    assert "FAILED" in last and f"the last good snapshot is {good['path']} (step {good['step']}," in last, err
    assert "Read-only file system" in last or "read-only" in last.lower(), last


def flip_a_bit_inside_the_largest_tensor(path: Path) -> None:
    """One bit of a tensor's stored bytes (not of a zip header, which no CRC covers), as a bad disk would."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length
    data[start + info.file_size // 2] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_snapshot_with_flipped_bits_is_refused_naming_it_and_offering_the_previous_one(tmp_path) -> None:
    from tests.conftest import open_session

    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with open_session(root / "train.py", max_steps=3, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        previous = Path(take_snapshot(live).path)
        live.session.worker.max_steps = 6
        from workbench.protocol.events import Resume

        live.send(Resume())
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        newest = Path(take_snapshot(live).path)
    flip_a_bit_inside_the_largest_tensor(newest)

    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--resume", "latest", "--max-steps", "2"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"snapshot {newest} is damaged" in lines[0] and "CRC-32" in lines[0]
    assert f"--resume {previous}" in lines[0], "the previous snapshot is offered"


def test_a_full_disk_is_said_in_words_before_anything_is_written(start_session, tmp_path) -> None:
    live = start_session({"train.py": BIG_TRAIN_PY})
    live.wait_running(2)
    folder = live.session.run_dir / "snapshots"
    with mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", at=folder):
        from workbench.protocol.events import TakeSnapshot

        live.send(TakeSnapshot())
        failed = live.wait_for(is_event("error", where="snapshot"), timeout=20)
        assert "disk full:" in failed.message and "free in" in failed.message and "the snapshot needs" in failed.message
        assert "unexpected pos" not in failed.message
        assert not [p for p in folder.iterdir()], "a temp file was left on the full disk"
        live.events.steps(2)  # training goes on


def test_a_disk_that_fills_during_the_write_is_said_in_words_and_leaves_no_temp_file(tmp_path) -> None:
    import torch

    from workbench.engine.actions.snapshot import write_snapshot
    from workbench.errors import UserError

    run = tmp_path / "run"
    folder = run / "snapshots"
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))  # 2 MB of weights
    with mounted("-t", "tmpfs", "-o", "size=3m", "tmpfs", at=folder):
        filler = folder / "other-files"
        filler.write_bytes(b"\0" * (1 << 20))  # free space passes the check, then runs out mid-write
        os.sync()
        with pytest.raises(UserError) as full:
            write_snapshot({"model": model}, 1, 0, run, namespaces=())
            write_snapshot({"model": model}, 2, 0, run, namespaces=())  # the second one cannot fit either way
        assert "disk full:" in str(full.value)
        assert not list(folder.glob(".tmp-*")), "a temp file was left behind"
