"""Write the session's scalars, code versions and evaluations as TensorBoard event files.

`--tensorboard` (optional extra: `pip install 'vram-bench[tensorboard]'`, which brings tensorboardX)
writes into `<run folder>/tensorboard/`, so `tensorboard --logdir .vram-bench/runs` shows every run.

How the session wires it (the contract):

    log = TensorBoardLog(session.bus, session.run_dir, resumed_from=config.resume, resumed_step=S_or_None)
    log.start()   # before the training thread starts: it subscribes in __init__, so nothing is missed
    ...
    log.stop()    # when the session stops: writes what is queued, flushes, closes, joins

`run_dir` is this run's own folder. The constructor raises `UserError` (one line) when tensorboardX
is missing, so the CLI can say so before anything starts. Both resume arguments may be left out: the
`ResumeLoaded` event the worker publishes before the first step carries the same facts (the snapshot
path and its step), and nothing is written before the first step or evaluation. A failed resume
(`ResumeLoaded(ok=False)`) starts the charts from scratch. Errors go out as `Error(where="tensorboard")`.

Why it looks the way it does:
- Every tensorboardX call happens on this thread; the training thread only publishes on the bus,
  which never blocks. The file is written record by record here with tensorboardX's `RecordWriter`
  and protos, not through `SummaryWriter`: SummaryWriter hands each event to a helper thread over a
  bounded queue, and when that thread hits a full disk it dies with a traceback on stderr and the
  next `add_scalar` blocks forever. Here a write error publishes one `Error(where="tensorboard")`
  and logging stops; training goes on.
- Cost on this thread: about 30 us per step with five scalars (one event holds all of a step's
  scalars; 18 us of it is tensorboardX's pure-Python CRC); `SummaryWriter.add_scalar` costs 50-64 us
  per scalar. Publishing costs the training thread about 1 us.
- A resume from a snapshot at step S continues the chart without a zig-zag. The resumed run's
  event files are copied into this run's folder (their names kept, so they sort first) with every
  point beyond S left out, and the new file starts with a `SessionLog.START` at S+1, as
  `SummaryWriter(purge_step=S+1)` writes it. The START alone is not enough: TensorBoard's Python
  loader purges only at a START after the first one of a run (a history written without one gets
  no purge), its Rust data server (the default of `tensorboard` where it is installed) ignores
  START and leaves the abandoned branch's evaluations and text entries beyond S, and importers that
  read the files in order (W&B, Aim) would see the abandoned steps. The other run's files are only read.
- TensorBoard draws no markers on a chart, so code versions go out twice: `code/version` (the code
  version at every step: a step function) and a text entry `code/versions` at the first step that
  runs the new code (with the step known, two saves between steps become one entry, and no entry
  is written twice at one step, which TensorBoard's Rust loader would reduce to the last).
- Non-finite values (a NaN loss) are written as they are, so the files agree with the event log.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import Error, Evaluation, Event, Exit, Rebuilt, Reload, ResumeLoaded, Step

MISSING = "--tensorboard needs tensorboardX: pip install 'vram-bench[tensorboard]'"
FOLDER = "tensorboard"
FILE_PREFIX = "events.out.tfevents."
VERSIONS_TAG = "code/versions"
POLL_SECONDS = 0.25  # how soon stop() is noticed
FLUSH_SECONDS = 2.0  # TensorBoard reloads every 5 s; a flush also fsyncs
QUEUE_EVENTS = 200_000  # steps queued while this thread is behind (a slow disk)
NOTES_SHOWN = 3
NOTE_CHARS = 200


def require_tensorboardx() -> None:
    """Raise the one-line UserError when the optional extra is not installed."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise UserError(MISSING) from None


def _wanted(event: Event) -> bool:
    return isinstance(event, (Step, Evaluation, Reload, Rebuilt, ResumeLoaded, Exit))


class TensorBoardLog(threading.Thread):
    """A daemon thread that turns bus events into TensorBoard event files under `run_dir/tensorboard`."""

    def __init__(
        self, bus: EventBus, run_dir: Path, *, resumed_from: Path | None = None, resumed_step: int | None = None
    ) -> None:
        require_tensorboardx()
        super().__init__(name="vram-bench-tensorboard", daemon=True)
        self.folder = Path(run_dir) / FOLDER
        self._bus = bus
        self._events = bus.subscribe(maxlen=QUEUE_EVENTS, accept=_wanted)
        self._stopping = threading.Event()
        self._file: _EventFile | None = None
        # A resume not yet applied to the files: (snapshot path, its step).
        self._resume: tuple[Path | None, int] | None = None
        if resumed_step is not None:
            self._resume = (Path(resumed_from) if resumed_from is not None else None, resumed_step)
        self._last_step = resumed_step or 0
        self._texts: list[tuple[float, str]] = []  # version entries waiting for the first step that runs them
        self._flushed_at = time.monotonic()

    # ----------------------------------------------------------------------------------- thread

    def run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - a full disk or a vanished folder must not cost the session
            self._bus.publish(Error(where="tensorboard", message=_failure(exc, self.folder)))
        finally:
            self._events.close()
            if self._file is not None:
                self._file.close_quietly()
                self._file = None

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, flush, close and join; safe before start() and after Exit."""
        self._stopping.set()
        if self.ident is None:  # never started: nothing was written
            self._events.close()
            return
        self.join(timeout)

    def _loop(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            batch = self._events.drain() if stopping else self._events.wait(POLL_SECONDS)
            exited = False
            for event in batch:
                if isinstance(event, Exit):
                    exited = True
                    break
                self._handle(event)
            if stopping or exited:
                self._finish()
                return
            if self._file is not None and time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
                self._file.flush()
                self._flushed_at = time.monotonic()

    def _finish(self) -> None:
        if self._texts:  # saved but never run: shown at the step it would have run first
            self._write_texts(self._last_step + 1)
        if self._file is not None:
            self._file.close()
            self._file = None

    # ----------------------------------------------------------------------------------- events

    def _handle(self, event: Event) -> None:
        if isinstance(event, Step) and event.rank:
            return  # another rank's step, streamed by rank 0 (torchrun): its own event log keeps it
        if isinstance(event, Step):
            if self._texts:
                self._write_texts(event.step)
            values = {"train/loss": event.loss, "time/step_ms": event.ms, "code/version": event.code_version}
            for name, value in event.scalars.items():
                values.setdefault(f"train/{name}", value)
            self._open().scalars(event.step, event.time, values)
            self._last_step = event.step
        elif isinstance(event, Evaluation):
            self._open().scalars(event.step, event.time, {f"eval/{k}": v for k, v in event.scalars.items()})
        elif isinstance(event, ResumeLoaded):
            self._on_resume(event)
        elif isinstance(event, (Reload, Rebuilt)):
            text = version_text(event)
            if text is not None:
                self._texts.append((event.time, text))

    def _on_resume(self, event: ResumeLoaded) -> None:
        if event.late:  # optimizer state that arrived later: the step did not change
            return
        if not event.ok:
            if self._file is None:  # training starts from what setup() built, at step 0
                self._resume, self._last_step = None, 0
            return
        self._resume, self._last_step = (Path(event.path), event.step), event.step
        if self._file is not None:  # a resume mid-session: the next write cuts the history at the step
            self._file.close()
            self._file = None

    def _write_texts(self, step: int) -> None:
        wall_time = self._texts[0][0]
        text = "\n\n".join(text for _, text in self._texts)
        self._texts.clear()
        self._open().text(step, wall_time, VERSIONS_TAG, text)

    def _open(self) -> _EventFile:
        """The open event file; the first write after a resume cuts the history at its step first."""
        if self._file is not None:
            return self._file
        self.folder.mkdir(parents=True, exist_ok=True)
        start_step = 0
        if self._resume is not None:
            snapshot, step = self._resume
            self._resume = None
            history = _history_folder(snapshot)
            if history is not None and _same_folder(history, self.folder):
                history = None
            try:
                cut_history(self.folder, history, step)
            except Exception as exc:  # noqa: BLE001 - unreadable history: the run goes on without it
                self._bus.publish(Error(where="tensorboard", message=_history_failure(exc, history, step)))
            start_step = step + 1
        self._file = _EventFile(self.folder, start_step)
        self._flushed_at = time.monotonic()
        return self._file


# ----------------------------------------------------------------------------------- text entries


def version_text(event: Reload | Rebuilt) -> str | None:
    """The `code/versions` entry for a new code version (markdown), or None when nothing changed."""
    notes = event.notes
    rollback = bool(notes) and notes[0].startswith("rolled back version")
    if not event.ok or not (event.changed or rollback):
        return None
    names = ", ".join(f"`{name}`" for name in event.changed)
    if isinstance(event, Rebuilt):
        head = f"v{event.code_version}: rebuild (setup() ran again)"
        if names:
            head += f": changed {names}"
        head += f"; carried {event.tensors_carried} tensors, {event.optimizer_states_carried} optimizer states"
        if event.schedulers_carried:
            head += f", {event.schedulers_carried} LR schedule(s)"
    else:
        head = f"v{event.code_version}: {event.file}: changed {names}" if names else f"v{event.code_version}: {event.file}"
    lines = [head]
    for note in notes[:NOTES_SHOWN]:
        lines.append(f"- {note if len(note) <= NOTE_CHARS else note[: NOTE_CHARS - 3] + '...'}")
    if len(notes) > NOTES_SHOWN:
        lines.append(f"- and {len(notes) - NOTES_SHOWN} more notes (see the event log)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- event files


class _EventFile:
    """One event file, written on the calling thread (tensorboardX framing and protos, no helper thread)."""

    def __init__(self, folder: Path, start_step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event as EventProto
        from tensorboardX.proto.event_pb2 import SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import RecordWriter
        from tensorboardX.summary import text

        self._proto = EventProto
        self._summary = Summary
        self._text = text
        self.path = folder / new_file_name(folder)
        self._records = RecordWriter(str(self.path))
        now = time.time()
        self._put(EventProto(wall_time=now, file_version="brain.Event:2"))
        # What SummaryWriter(purge_step=S+1) writes: TensorBoard's Python loader drops every point
        # read so far at or beyond this step (at any START after the first one of a run).
        self._put(EventProto(wall_time=now, step=start_step, session_log=SessionLog(status=SessionLog.START)))

    def scalars(self, step: int, wall_time: float, values: dict[str, Any]) -> None:
        """All of a step's scalars in one event: one record, one CRC, instead of one per scalar."""
        fields = []
        for tag, value in values.items():
            number = _number(value)
            if number is not None:
                fields.append(self._summary.Value(tag=tag, simple_value=number))
        if fields:
            self._put(self._proto(wall_time=wall_time, step=step, summary=self._summary(value=fields)))

    def text(self, step: int, wall_time: float, tag: str, text: str) -> None:
        self._put(self._proto(wall_time=wall_time, step=step, summary=self._text(tag, text)))

    def _put(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.flush()
        self._records.close()

    def close_quietly(self) -> None:
        try:
            self._records.close()
        except OSError:
            pass


def _number(value: Any) -> float | None:
    """A scalar as TensorBoard stores it (NaN and Inf stay as they are), or None for what is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def new_file_name(folder: Path) -> str:
    """A name that sorts after every event file already there: TensorBoard reads them in name order."""
    stamp = int(time.time())
    taken = sorted(p.name for p in folder.glob(FILE_PREFIX + "*"))
    if taken:
        newest = taken[-1][len(FILE_PREFIX) :].split(".", 1)[0]
        if newest.isdigit():
            stamp = max(stamp, int(newest) + 1)
    return f"{FILE_PREFIX}{stamp}.{socket.gethostname()}.{os.getpid()}"


def _history_folder(snapshot: Path | None) -> Path | None:
    """`<runs>/<run>/snapshots/step-N.pt` -> `<runs>/<run>/tensorboard`, when the snapshot is in a run folder."""
    if snapshot is None or snapshot.parent.name != "snapshots":
        return None
    folder = snapshot.parent.parent / FOLDER
    return folder if folder.is_dir() else None


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def cut_history(folder: Path, history: Path | None, step: int) -> None:
    """Copy `history`'s event files into `folder` and drop every point beyond `step` from all of them.

    The copies keep their names; `history` is only read. Files already in `folder` are this run's
    own (a resume in mid-session) and are rewritten in place.
    """
    if history is not None:
        for source in sorted(history.glob(FILE_PREFIX + "*")):
            _copy_until(source, folder / source.name, step)
    for own in sorted(folder.glob(FILE_PREFIX + "*")):
        if any(_step_of(data) > step for _, data in read_records(own)):
            _copy_until(own, own, step)


def _copy_until(source: Path, target: Path, step: int) -> None:
    """Write `source`'s records up to `step` to `target`, through a temp name TensorBoard does not read."""
    temp = target.with_name(f".tb-copy-{os.getpid()}.partial")
    try:
        with temp.open("wb") as out:
            for record, data in read_records(source):
                if _step_of(data) <= step:
                    out.write(record)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def read_records(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Each TFRecord of an event file: (the framed record, its data); stops at a damaged or cut-off tail."""
    from tensorboardX.record_writer import masked_crc32c

    with path.open("rb") as source:
        while True:
            header = source.read(12)
            if len(header) < 12 or struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
                return  # the end, or the tail of a writer that was killed mid-record
            (length,) = struct.unpack("<Q", header[:8])
            rest = source.read(length + 4)
            if len(rest) < length + 4:
                return
            yield header + rest, rest[:length]


def _step_of(data: bytes) -> int:
    """The step of a record; the file-version record counts as -1, so a cut always keeps it."""
    from tensorboardX.proto.event_pb2 import Event as EventProto

    event = EventProto.FromString(data)
    return -1 if event.WhichOneof("what") == "file_version" else event.step


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _history_failure(exc: BaseException, history: Path | None, step: int) -> str:
    if history is not None:
        return f"the TensorBoard history in {history} was not copied ({_reason(exc)}); this run's charts start at step {step + 1}"
    return f"TensorBoard points beyond step {step} were not removed ({_reason(exc)}); TensorBoard's Python loader still drops them"


def _failure(exc: BaseException, folder: Path) -> str:
    return f"TensorBoard logging stopped: cannot write in {folder} ({_reason(exc)}); training goes on without it"
