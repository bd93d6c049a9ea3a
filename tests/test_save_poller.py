"""Saves on a network filesystem: file events do not see a save made on another machine, so the session looks.

workbench/engine/hotswap/filesystem.py reads the mount table; workbench/engine/hotswap/poller.py looks at the files the
session runs. This machine has no NFS mount: the mount table's text is given to the parser, and the session is told its
folder is on nfs4 through `filesystem_type`, the one place that reads the table; the poller, the files, the thread,
the reloads and the session are real.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conftest import TRAIN_PY, is_event, save
from workbench.cli import build_parsers
from workbench.engine import session as session_module
from workbench.engine.hotswap.filesystem import filesystem_type, is_shared
from workbench.engine.hotswap.poller import SavePoller
from workbench.engine.hotswap.watcher import SourceWatcher

MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
30 22 0:40 / /mnt/cluster rw,relatime - nfs4 server:/export rw,vers=4.2
31 30 8:2 / /mnt/cluster/scratch rw,relatime - ext4 /dev/sdb1 rw
32 22 0:41 / /mnt/my\\040share rw - cifs //host/share rw
33 22 0:42 / /home/me/remote rw - fuse.sshfs me@laptop:/code rw
34 22 0:43 / /data rw - ext4 /dev/sdc1 rw
35 34 0:44 / /data rw - lustre 10.0.0.1@tcp:/fs rw
"""


@pytest.mark.parametrize(("path", "fstype"), [
    ("/home/me/train.py", "ext4"),
    ("/mnt/cluster/proj/train.py", "nfs4"),
    ("/mnt/cluster/scratch/proj/train.py", "ext4"),  # a local disk mounted inside the share
    ("/mnt/my share/proj/train.py", "cifs"),  # the mount point's space is written \040
    ("/home/me/remote/train.py", "fuse.sshfs"),
    ("/data/proj/train.py", "lustre"),  # two mounts at one place: the later is on top
])
def test_the_filesystem_of_a_path_is_its_deepest_mount(path: str, fstype: str) -> None:
    assert filesystem_type(Path(path), MOUNTINFO) == fstype


def test_a_mount_hidden_by_a_later_one_over_its_parent_is_not_the_paths() -> None:
    """NFS mounted at /mnt/cluster/scratch, then a local disk over /mnt/cluster: the path's device tells them apart."""
    hidden = MOUNTINFO + "36 22 0:50 / /mnt/cluster/scratch rw - nfs4 server:/scratch rw\n" \
                         "37 22 8:3 / /mnt/cluster rw - ext4 /dev/sdd1 rw\n"
    assert filesystem_type(Path("/mnt/cluster/scratch/train.py"), hidden, device="8:3") == "ext4"
    assert filesystem_type(Path("/mnt/cluster/scratch/train.py"), hidden) == "nfs4"  # without the device: the deepest


def test_shared_filesystems_are_told_from_local_ones(tmp_path: Path) -> None:
    assert [t for t in ("nfs4", "nfs", "lustre", "gpfs", "cifs", "fuse.sshfs", "9p", "virtiofs") if not is_shared(t)] == []
    assert [t for t in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "fuse.fuse-overlayfs", None) if is_shared(t)] == []
    here = filesystem_type(tmp_path)  # this machine's own table
    assert here is not None and not is_shared(here), here


def test_the_poller_reports_a_save_in_place_a_new_file_over_it_a_deleted_file_and_a_file_back_again(
    tmp_path: Path,
) -> None:
    a, b, c = (tmp_path / name for name in ("a.py", "b.py", "c.py"))
    for path in (a, b, c):
        path.write_text("X = 1\n")
    tracked = [a, b]
    reports: list[set[Path]] = []
    got = threading.Event()

    def on_change(paths: set[Path], detected_at: float) -> None:
        reports.append(paths)
        got.set()

    poller = SavePoller(lambda: list(tracked), on_change, lambda message: reports.append({Path(message)}), 0.02)
    poller.start()
    try:
        assert poller.ready.wait(5)
        tracked.append(c)  # tracked later (a module imported lazily): looked at, not reported
        time.sleep(0.1)
        assert reports == []

        def expect(paths: set[Path]) -> None:
            assert got.wait(5), f"no report of {paths}"
            time.sleep(0.1)  # nothing more comes
            assert reports == [paths]
            reports.clear()
            got.clear()

        a.write_text("X = 2\n")  # in place, same size
        expect({a})
        (tmp_path / "b.tmp").write_text("Y = 1\n")
        os.replace(tmp_path / "b.tmp", b)  # an editor that writes a new file over the old one
        expect({b})
        c.unlink()
        expect({c})  # gone: the reload says the old code keeps running
        c.write_text("X = 1\n")
        expect({c})
        tracked.remove(c)
        c.unlink()  # no longer run: nothing to say
        time.sleep(0.1)
        assert reports == []
    finally:
        poller.stop()
        poller.join(5)


def test_a_session_on_a_network_filesystem_polls_and_says_so(start_session, monkeypatch) -> None:
    monkeypatch.setattr(session_module, "filesystem_type", lambda path: "nfs4")
    live = start_session(poll_seconds=None)
    assert isinstance(live.session.watcher, SavePoller) and live.session.watcher.interval == 1.0
    note = live.wait_for(is_event("error", where="watching"))
    assert note.is_warning and "on nfs4" in note.message and "--poll-saves 0" in note.message, note
    live.wait_running()
    save(live.entry, TRAIN_PY.replace('"scale": SCALE}', '"scale": SCALE, "polled": 1.0}'))
    reload = live.wait_for(is_event("reload", file="train.py"), timeout=10)
    assert reload.ok and reload.changed == ("step",), reload
    live.events.steps(1, lambda e: e.scalars.get("polled") == 1.0)
    source = live.entry.read_text()
    live.entry.unlink()
    deleted = live.wait_for(is_event("reload", ok=False), timeout=10)
    assert "train.py was deleted; the old code keeps running" in deleted.error, deleted
    live.events.steps(2, lambda e: e.scalars.get("polled") == 1.0)  # still training, on the code it ran
    save(live.entry, source)


def test_file_events_where_they_see_every_save_or_where_the_user_says_so(start_session, monkeypatch) -> None:
    assert isinstance(start_session().session.watcher, SourceWatcher)  # this machine's disk: file events
    monkeypatch.setattr(session_module, "filesystem_type", lambda path: "nfs4")
    live = start_session(poll_seconds=0.0)
    assert isinstance(live.session.watcher, SourceWatcher)
    assert not live.events.of("error")


@pytest.mark.parametrize(("value", "accepted"), [("0", 0.0), ("0.5", 0.5), ("2", 2.0), ("-1", None), ("0.01", None),
                                                 ("soon", None)])
def test_poll_saves_takes_seconds_or_zero(value: str, accepted: float | None, capsys) -> None:
    _, run = build_parsers()
    if accepted is None:
        with pytest.raises(SystemExit):
            run.parse_args(["train.py", "--poll-saves", value])
        assert "--poll-saves" in capsys.readouterr().err
    else:
        assert run.parse_args(["train.py", "--poll-saves", value]).poll_saves == accepted


def test_a_save_that_keeps_size_and_time_on_a_whole_second_clock_is_found_by_its_content(tmp_path: Path) -> None:
    """sshfs and Lustre keep whole seconds: `lr = 0.1` -> `lr = 0.2` within the second of the last save keeps the
    time, the size and the inode. A file written that recently is compared by content."""
    path = tmp_path / "train.py"
    path.write_text("lr = 0.1\n")
    second = (time.time_ns() // 1_000_000_000) * 1_000_000_000
    os.utime(path, ns=(second, second))
    reports: list[set[Path]] = []
    poller = SavePoller(lambda: [path], lambda paths, at: reports.append(paths), reports.append, 60)
    assert poller.look() == set()  # the first look
    with open(path, "r+") as file:  # in place: the same inode
        file.write("lr = 0.2\n")
    os.utime(path, ns=(second, second))
    assert poller.look() == {path} and reports == [{path}]
    assert poller.look() == set()  # the same content again: nothing


def test_a_failing_look_is_said_once_and_the_poller_keeps_looking(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("X = 1\n")
    calls = 0
    failures: list[str] = []
    found = threading.Event()

    def files() -> list[Path]:
        nonlocal calls
        calls += 1
        if 2 <= calls <= 5:
            raise OSError(116, "Stale file handle")  # ESTALE, as NFS gives it after the server replaced a file
        return [path]

    poller = SavePoller(files, lambda paths, at: found.set(), failures.append, 0.02)
    poller.start()
    try:
        deadline = time.monotonic() + 5
        while calls < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        path.write_text("X = 22\n")
        assert found.wait(5), "the save after the failures was not found"
    finally:
        poller.stop()
        poller.join(5)
    assert len(failures) == 1 and "Stale file handle" in failures[0] and "tried again" in failures[0], failures


def test_poll_saves_and_no_watch_are_one_choice(capsys) -> None:
    _, run = build_parsers()
    with pytest.raises(SystemExit):
        run.parse_args(["train.py", "--no-watch", "--poll-saves", "1"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_file_saved_after_its_import_and_before_its_first_look_is_reported_at_that_look(tmp_path: Path) -> None:
    """A module setup() imports is tracked up to an interval after: a save in between is not lost."""
    imported, untouched = tmp_path / "helper.py", tmp_path / "model.py"
    imported.write_text("X = 2\n")  # saved after the import, whose source was X = 1
    untouched.write_text("Y = 1\n")
    live = {imported: "X = 1\n", untouched: "Y = 1\n"}
    poller = SavePoller(lambda: [imported, untouched], lambda paths, at: None, lambda message: None, 60,
                        live_source=live.get)
    assert poller.look() == {imported}
    assert poller.look() == set()
