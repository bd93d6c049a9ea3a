"""`--tensorboard`: real bus, real events, real event files, read back the way TensorBoard reads them.

The reader below is this test's own (TFRecord framing, CRCs checked, tensorboardX's protos), and it
applies the purge rules of TensorBoard's Python EventAccumulator: with file version 2, the first
`SessionLog.START` of a run only marks it, and every later START at step P drops every point read
so far at step >= P. The resume tests also read without purging, as TensorBoard's Rust loader and
W&B's importer do (they ignore START).
"""

from __future__ import annotations

import errno
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("tensorboardX")

from tensorboardX import SummaryWriter  # noqa: E402
from tensorboardX.crc32c import crc32c  # noqa: E402
from tensorboardX.proto.event_pb2 import Event as EventProto  # noqa: E402
from tensorboardX.proto.event_pb2 import SessionLog  # noqa: E402

from workbench.errors import UserError  # noqa: E402
from workbench.protocol.eventbus import EventBus  # noqa: E402
from workbench.protocol.events import Error, Evaluation, Exit, Rebuilt, Reload, ResumeLoaded, Step  # noqa: E402
from workbench.engine.tensorboard_log import TensorBoardLog, require_tensorboardx  # noqa: E402

# --------------------------------------------------------------------------- a tiny event reader


def _masked(data: bytes) -> int:
    crc = crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_file(path: Path) -> list[EventProto]:
    """Every record of one event file; a bad CRC fails the test."""
    events = []
    data = path.read_bytes()
    at = 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert header_crc == _masked(header), f"{path.name}: bad length CRC at byte {at}"
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert body_crc == _masked(body), f"{path.name}: bad data CRC at byte {at}"
        events.append(EventProto.FromString(body))
        at += 16 + length
    return events


@dataclass
class Run:
    """What a loader holds for one run folder: scalar and text series by tag, as (step, value)."""

    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)

    def steps(self, tag: str) -> list[int]:
        return [step for step, _ in self.scalars.get(tag, [])]

    def values(self, tag: str) -> list[float]:
        return [value for _, value in self.scalars.get(tag, [])]


def event_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if "tfevents" in p.name)


def read_run(folder: Path, *, purge: bool = True) -> Run:
    """All event files of a run, in name order (as TensorBoard reads them)."""
    run = Run()
    file_version = 0
    seen_start = False
    for path in event_files(folder):
        for event in read_file(path):
            if event.WhichOneof("what") == "file_version":
                file_version = int(event.file_version.split(":")[1])
                continue
            if event.WhichOneof("what") == "session_log" and event.session_log.status == SessionLog.START:
                run.starts.append(event.step)
                if purge and file_version >= 2:
                    if seen_start:
                        _purge(run, event.step)
                    seen_start = True
                continue
            for value in event.summary.value:
                if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "text":
                    text = value.tensor.string_val[0].decode()
                    run.texts.setdefault(value.tag, []).append((event.step, text))
                else:
                    run.scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return run


def _purge(run: Run, step: int) -> None:
    for series in (*run.scalars.values(), *run.texts.values()):
        series[:] = [(s, v) for s, v in series if s < step]


# --------------------------------------------------------------------------- helpers

VERSIONS = "code/versions/text_summary"  # tensorboardX's text summaries add "/text_summary"


def start_log(bus: EventBus, run_dir: Path, **kwargs) -> TensorBoardLog:
    log = TensorBoardLog(bus, run_dir, **kwargs)
    log.start()
    return log


def steps(first: int, last: int, *, loss=lambda i: 1.0 / i, version: int = 1, scalars=None) -> list[Step]:
    return [
        Step(step=i, loss=loss(i), ms=10.0 + i, scalars=dict(scalars or {}), code_version=version)
        for i in range(first, last + 1)
    ]


def finish(bus: EventBus, log: TensorBoardLog, last_step: int) -> None:
    bus.publish(Exit(reason="quit", step=last_step))
    log.join(timeout=10)
    assert not log.is_alive()


# --------------------------------------------------------------------------- steps, versions, evaluate


def test_every_step_writes_its_scalars_and_the_code_version_series(tmp_path: Path) -> None:
    bus = EventBus()
    log = start_log(bus, tmp_path)
    for event in steps(1, 3, scalars={"lr": 0.1, "grad_norm": float("nan")}, version=1):
        bus.publish(event)
    bus.publish(Reload(ok=True, file="train.py", changed=("step",), code_version=2))
    for event in steps(4, 6, scalars={"lr": 0.05}, version=2):
        bus.publish(event)
    finish(bus, log, 6)

    run = read_run(tmp_path / "tensorboard")
    assert run.steps("train/loss") == [1, 2, 3, 4, 5, 6]
    assert run.values("train/loss") == pytest.approx([1.0 / i for i in range(1, 7)])
    assert run.values("time/step_ms") == pytest.approx([11, 12, 13, 14, 15, 16])
    assert run.steps("train/lr") == [1, 2, 3, 4, 5, 6]
    assert run.values("train/lr") == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05])  # float32 in the file
    assert run.steps("train/grad_norm") == [1, 2, 3]  # NaN is written as it is
    assert all(v != v for v in run.values("train/grad_norm"))
    assert run.scalars["code/version"] == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    assert run.texts[VERSIONS] == [(4, "v2: train.py: changed `step`")]  # at the first step that runs v2


def test_version_texts_say_what_changed_and_skip_saves_that_changed_nothing(tmp_path: Path) -> None:
    bus = EventBus()
    log = start_log(bus, tmp_path)
    bus.publish(steps(1, 1)[0])
    bus.publish(Reload(ok=True, file="train.py", changed=(), code_version=1))  # a comment: no new version
    bus.publish(Reload(ok=False, file="train.py", error="SyntaxError", code_version=1))
    bus.publish(steps(2, 2)[0])
    # Two saves between steps: one entry, both versions in it.
    bus.publish(Reload(ok=True, file="model.py", changed=("Block.forward",), code_version=2, notes=("kept the cache",)))
    bus.publish(Reload(ok=True, file="train.py", changed=("step", "LR"), code_version=3))
    bus.publish(steps(3, 3, version=3)[0])
    bus.publish(Rebuilt(ok=True, code_version=4, changed=("setup",), tensors_carried=12, optimizer_states_carried=1))
    bus.publish(steps(4, 4, version=4)[0])
    bus.publish(Rebuilt(ok=False, error="setup() raised", code_version=4))
    bus.publish(
        Reload(
            ok=True, file="train.py", changed=("step", "LR"), code_version=3,
            notes=("rolled back version 3: the code before it runs again; the file on disk still has the newer code",),
        )
    )
    bus.publish(steps(5, 5, version=3)[0])
    bus.publish(Reload(ok=True, file="train.py", changed=("step",), code_version=5))  # saved, never run
    finish(bus, log, 5)

    texts = read_run(tmp_path / "tensorboard").texts[VERSIONS]
    assert [step for step, _ in texts] == [3, 4, 5, 6]
    assert texts[0][1] == (
        "v2: model.py: changed `Block.forward`\n- kept the cache\n\nv3: train.py: changed `step`, `LR`"
    )
    assert texts[1][1] == "v4: rebuild (setup() ran again): changed `setup`; carried 12 tensors, 1 optimizer states"
    assert texts[2][1].startswith("v3: train.py: changed `step`, `LR`\n- rolled back version 3: the code before it")
    assert texts[3][1] == "v5: train.py: changed `step`"  # the step it would have run first


def test_evaluate_results_go_out_at_their_step(tmp_path: Path) -> None:
    bus = EventBus()
    log = start_log(bus, tmp_path)
    for event in steps(1, 4):
        bus.publish(event)
    bus.publish(Evaluation(step=4, scalars={"val_loss": 0.5, "accuracy": 0.9}, ms=30.0))
    for event in steps(5, 8):
        bus.publish(event)
    bus.publish(Evaluation(step=8, scalars={"val_loss": 0.25, "accuracy": 0.95}))
    log.stop()  # stop() writes what is queued, like Exit
    assert not log.is_alive()

    run = read_run(tmp_path / "tensorboard")
    assert run.scalars["eval/val_loss"] == [(4, 0.5), (8, 0.25)]
    assert run.steps("eval/accuracy") == [4, 8]
    assert run.values("eval/accuracy") == pytest.approx([0.9, 0.95])
    assert run.steps("train/loss") == list(range(1, 9))


# --------------------------------------------------------------------------- resume


def older_run(runs: Path) -> tuple[Path, Path]:
    """A finished run that went on to step 30 (stock SummaryWriter, as any other tool writes it)."""
    run_dir = runs / "older"
    (run_dir / "snapshots").mkdir(parents=True)
    snapshot = run_dir / "snapshots" / "step-00000020.pt"
    snapshot.write_bytes(b"not read by this test")
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for i in range(1, 31):
        writer.add_scalar("train/loss", -float(i), i)  # negative: the older run's points are easy to tell
        writer.add_scalar("code/version", 1, i)
    writer.add_scalar("eval/val_loss", -10.0, 10)
    writer.add_scalar("eval/val_loss", -25.0, 25)  # the abandoned branch's evaluation
    writer.add_text("code/versions", "v2: train.py: changed `step`", 22)  # and its code version
    writer.close()
    return run_dir, snapshot


@pytest.mark.parametrize("told", ["constructor", "event only"])
def test_a_resume_from_step_s_continues_the_older_runs_chart_and_drops_its_points_beyond_s(
    tmp_path: Path, told: str
) -> None:
    older, snapshot = older_run(tmp_path / "runs")
    before = {p.name: p.read_bytes() for p in event_files(older / "tensorboard")}
    new_run = tmp_path / "runs" / "newer"
    bus = EventBus()
    kwargs = {"resumed_from": snapshot, "resumed_step": 20} if told == "constructor" else {}
    log = start_log(bus, new_run, **kwargs)
    bus.publish(ResumeLoaded(ok=True, path=str(snapshot), step=20, tensors=4, optimizers=1))
    for event in steps(21, 25, loss=float, version=1):
        bus.publish(event)
    bus.publish(ResumeLoaded(ok=True, path=str(snapshot), step=25, optimizers=1, late=True))  # changes nothing
    finish(bus, log, 25)

    for purge in (True, False):  # TensorBoard's Python loader; its Rust loader and W&B ignore the purge
        run = read_run(new_run / "tensorboard", purge=purge)
        assert run.scalars["train/loss"] == [(i, -float(i)) for i in range(1, 21)] + [(i, float(i)) for i in range(21, 26)]
        assert run.steps("code/version") == list(range(1, 26))
        assert run.scalars["eval/val_loss"] == [(10, -10.0)]
        assert VERSIONS not in run.texts
    assert read_run(new_run / "tensorboard").starts[-1] == 21  # what SummaryWriter(purge_step=21) writes

    names = [p.name for p in event_files(new_run / "tensorboard")]
    assert names[:-1] == sorted(before)  # the history keeps its names and sorts before the new file
    assert {p.name: p.read_bytes() for p in event_files(older / "tensorboard")} == before  # only read


def test_a_resume_from_a_snapshot_outside_a_run_folder_still_starts_at_s_plus_1(tmp_path: Path) -> None:
    snapshot = tmp_path / "elsewhere" / "model.pt"
    bus = EventBus()
    log = start_log(bus, tmp_path / "run", resumed_from=snapshot, resumed_step=7)
    bus.publish(ResumeLoaded(ok=True, path=str(snapshot), step=7))
    for event in steps(8, 9):
        bus.publish(event)
    finish(bus, log, 9)
    run = read_run(tmp_path / "run" / "tensorboard")
    assert run.steps("train/loss") == [8, 9]
    assert run.starts == [8]


def test_a_failed_resume_starts_the_chart_from_scratch(tmp_path: Path) -> None:
    older, snapshot = older_run(tmp_path / "runs")
    bus = EventBus()
    log = start_log(bus, tmp_path / "runs" / "newer", resumed_from=snapshot, resumed_step=20)
    bus.publish(ResumeLoaded(ok=False, path=str(snapshot), error="shapes differ"))
    for event in steps(1, 3):
        bus.publish(event)
    finish(bus, log, 3)
    run = read_run(tmp_path / "runs" / "newer" / "tensorboard", purge=False)
    assert run.steps("train/loss") == [1, 2, 3]
    assert len(event_files(tmp_path / "runs" / "newer" / "tensorboard")) == 1  # no history copied


# --------------------------------------------------------------------------- the extra and failures


def test_without_tensorboardx_the_user_gets_one_line_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(UserError) as caught:
        require_tensorboardx()
    assert str(caught.value) == "--tensorboard needs tensorboardX: pip install 'vram-bench[tensorboard]'"
    with pytest.raises(UserError, match="pip install 'vram-bench\\[tensorboard\\]'"):
        TensorBoardLog(EventBus(), tmp_path)


def errors_of(events) -> list[Error]:
    return [e for e in events if isinstance(e, Error) and e.where == "tensorboard"]


def test_a_folder_that_cannot_be_written_gives_one_error_and_training_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.write_text("a file where the run folder should be")  # root ignores chmod; this fails for anyone
    bus = EventBus()
    seen = bus.subscribe()
    log = start_log(bus, run_dir)
    for event in steps(1, 50):
        bus.publish(event)
    log.join(timeout=10)
    assert not log.is_alive()  # it stopped writing by itself
    for event in steps(51, 60):
        bus.publish(event)  # publishing still works: nobody waits for the log
    log.stop()
    (error,) = errors_of(seen.drain())
    assert error.message.startswith(f"TensorBoard logging stopped: cannot write in {run_dir / 'tensorboard'}")
    assert "training goes on" in error.message


def test_a_full_disk_mid_run_gives_one_error_and_no_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboardX import record_writer

    written = {"records": 0}
    real_write = record_writer.RecordWriter.write

    def write_until_full(self, data: bytes) -> None:
        written["records"] += 1
        if written["records"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write_until_full)
    bus = EventBus()
    seen = bus.subscribe()
    log = start_log(bus, tmp_path)
    for event in steps(1, 100):
        bus.publish(event)
    log.join(timeout=10)
    assert not log.is_alive()
    log.stop()
    (error,) = errors_of(seen.drain())
    assert "No space left on device" in error.message


# --------------------------------------------------------------------------- through a real session


def test_a_session_with_tensorboard_writes_its_steps_and_versions_and_a_resume_continues_without_the_branch(
    tmp_path: Path,
) -> None:
    from tests.conftest import is_event, make_project, open_session, save
    from tests.test_resume_faults import TRAIN_PY
    from workbench.protocol.events import Resume, TakeSnapshot

    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    with open_session(root / "train.py", tensorboard=True, max_steps=4, exit_at_max_steps=False) as first:
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        first.send(TakeSnapshot())
        snapshot = Path(first.wait_for(is_event("snapshot"), timeout=20).path)
        save(first.entry, TRAIN_PY.replace("SLEEP = 0.003", "SLEEP = 0.002"))
        first.wait_for(is_event("reload", code_version=1), timeout=20)
        first.session.worker.max_steps = 9
        first.send(Resume())
        first.wait_for(is_event("paused", reason="max steps"), timeout=30)
        first_run = first.session.run_dir
    written = read_run(first_run / "tensorboard")
    assert written.steps("train/loss") == list(range(1, 10))
    assert written.values("code/version") == [0.0] * 4 + [1.0] * 5
    assert [(step, text.split(":")[0]) for step, text in written.texts[VERSIONS]] == [(5, "v1")]

    with open_session(root / "train.py", tensorboard=True, resume=snapshot, max_steps=6, exit_at_max_steps=False) as resumed:
        resumed.wait_for(is_event("paused", reason="max steps"), timeout=30)
        resumed_run = resumed.session.run_dir
    branch = read_run(resumed_run / "tensorboard")
    assert branch.steps("train/loss") == [1, 2, 3, 4, 5, 6], "the abandoned steps 5..9 of the first run remain"
    assert VERSIONS not in branch.texts, "the first run's version text beyond step 4 remains"
    assert read_run(first_run / "tensorboard").steps("train/loss") == list(range(1, 10)), "the first run was changed"
