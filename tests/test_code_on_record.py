"""A snapshot keeps which code its run was running; a resume says every file that runs other code now.

A resume runs the project's files as they are on disk. Before this record, a run rolled back after a save, then
snapshotted and resumed, trained the snapshot's weights under the saved code that the rollback had taken out, and the
resume said nothing: it looked like the same run going on (workbench/engine/code_on_record.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import TRAIN_PY, is_event, line_of, make_project, open_session, save
from workbench.engine.code_on_record import KEY, digest, record, resume_notes
from workbench.protocol.events import Rollback, TakeSnapshot

CHANGED_STEP = TRAIN_PY.replace("loss = ((state", "loss = 1.0 * ((state")
WITH_CALL = TRAIN_PY.replace("SCALE = 1.0\n", 'SCALE = 1.0\nSIZE = int("3")\n').replace(
    '"scale": SCALE}', '"scale": SCALE, "size": SIZE}')


def _snapshot_of(live) -> Path:
    live.send(TakeSnapshot())
    return Path(live.wait_for(is_event("snapshot"), timeout=20).path)


def _resume_notes(root: Path, snapshot: Path) -> tuple[str, ...]:
    with open_session(root / "train.py", resume=snapshot, max_steps=snapshot_step(snapshot) + 1,
                      exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=30)
        assert resumed.ok, resumed
        return tuple(resumed.notes)


def snapshot_step(path: Path) -> int:
    return int(path.name.split("-")[1].split(".")[0])


def _code_notes(notes: tuple[str, ...]) -> list[str]:
    return [n for n in notes if "snapshot's run" in n or "since the snapshot was taken" in n]


def test_a_resume_after_a_rollback_says_the_snapshots_run_was_not_running_the_file(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with open_session(root / "train.py") as live:
        live.wait_running(2)
        save(live.entry, CHANGED_STEP)
        assert live.wait_for(is_event("reload", file="train.py")).changed == ("step",)
        live.send(Rollback())
        back = live.wait_for(is_event("reload", code_version=2))
        assert "rolled back version 1" in back.notes[0], back.notes
        snapshot = _snapshot_of(live)
    saved = torch.load(snapshot, weights_only=True)[KEY]
    assert saved["train.py"]["ran"] == digest(TRAIN_PY) and saved["train.py"]["disk"] == digest(CHANGED_STEP)

    (note,) = _code_notes(_resume_notes(root, snapshot))
    assert note.startswith("the snapshot's run was not running train.py as it is on disk (a rollback since its save, "
                           "or a save that was refused): this run runs the file"), note


def test_a_resume_says_a_file_changed_since_the_snapshot_and_nothing_when_it_did_not(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with open_session(root / "train.py") as live:
        live.wait_running(2)
        snapshot = _snapshot_of(live)
    assert _code_notes(_resume_notes(root, snapshot)) == [], "the files are as the snapshot's run ran them"

    (root / "train.py").write_text(CHANGED_STEP)
    (note,) = _code_notes(_resume_notes(root, snapshot))
    assert note == ("train.py changed since the snapshot was taken: this run runs it as it is now, not the code the "
                    "snapshot's run ran"), note


def test_a_resume_names_the_statements_the_snapshots_run_had_left_for_x(tmp_path: Path) -> None:
    root = make_project(tmp_path, {"train.py": WITH_CALL})
    edited = WITH_CALL.replace('int("3")', 'int("5")')
    with open_session(root / "train.py") as live:
        live.wait_running(2)
        save(live.entry, edited)
        reload = live.wait_for(is_event("reload", file="train.py"))
        assert any("was not re-run" in n for n in reload.notes), reload.notes
        snapshot = _snapshot_of(live)
    (note,) = _code_notes(_resume_notes(root, snapshot))
    assert note == ("statements the snapshot's run had left for x (not re-run since their save) run now as the file "
                    f"has them: train.py (line {line_of(edited, 'SIZE = int')}: `SIZE = int(\"5\")`)"), note


class _Reloader:
    """The three things the record reads, for a file whose save had not been read when the snapshot was taken."""

    def __init__(self, path: Path, ran: str, read: str | None) -> None:
        self.path, self.ran, self.read = path, ran, read

    def tracked_files(self) -> list[Path]:
        return [self.path]

    def applied_source(self, path: Path) -> str | None:
        return self.ran

    def read_source(self, path: Path) -> str | None:
        return self.read

    def statements_left_for_x(self, path: Path) -> list[str]:
        return []


def test_a_save_on_its_way_at_the_snapshot_is_not_called_a_rollback(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(CHANGED_STEP)
    on_its_way = record(_Reloader(path, TRAIN_PY, read=None), lambda p: p.name)
    refused = record(_Reloader(path, TRAIN_PY, read=CHANGED_STEP), lambda p: p.name)
    assert on_its_way["train.py"]["read"] is False and refused["train.py"]["read"] is True
    (note,) = resume_notes(on_its_way, tmp_path)
    assert note.startswith("the snapshot was taken as a save of train.py was on its way"), note
    (note,) = resume_notes(refused, tmp_path)
    assert note.startswith("the snapshot's run was not running train.py"), note
    path.unlink()
    assert resume_notes(refused, tmp_path) == ("train.py, which the snapshot's run ran, cannot be read now",)
    assert resume_notes(None, tmp_path) == (), "a snapshot from before the record claims nothing"
