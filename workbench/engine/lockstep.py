"""Every rank runs the same commands at the same step boundary.

The training loop calls `Lockstep.boundary` where a single process drains its command queue.
Each rank drains its own queue (rank 0's is fed by the front ends and the reload thread; the
others' only by their own memory guard, signals and failures), encodes what it found as JSON,
and posts it with the boundary exchange (workbench/engine/control_plane.py). The exchange is in
two parts. The rows (numbers, how many bytes each rank has to say, whether they hold commands)
are posted without waiting and collected at the next boundary, so no step waits for their round
trip. Then, only when some rank has something, the bytes: when they hold a command every rank
gathers them at once (one round trip per command, never per step) and dispatches the same batch,
in rank order, one turn after the exchange that carried it; when they hold only the steps ranks
> 0 trained (for rank 0's stream, sent at most every STEPS_SECONDS), they are posted without
waiting and collected a turn later. A rank with just one step since the last exchange (steps long
enough that every turn exchanges) needs no bytes: its row already holds that step. Whatever is in flight is collected at the next boundary in the
order it was posted, before any command runs, so commands (which may make collectives of their own)
run with nothing in flight.

Short steps do not exchange at every boundary: rank 0 sets a cadence (every how many loop turns
the ranks exchange) so that exchanges are about `EXCHANGE_SECONDS` apart, and every rank reads
it from the same exchange, so all keep exchanging at the same turns. A command does not wait for
that: rank 0's doorbell (workbench/engine/doorbell.py) has every rank exchange at a turn it proposes
(the next boundary or two) and collect that exchange at once; when a rank cannot take part in time,
rank 0 proposes a later turn. A rank > 0 with a command of its own asks rank 0, through the store, to propose.
While paused the ranks exchange every turn.

A saved file crosses as its source text: every rank prepares the same plan from the same bytes,
the ranks agree that all of them can apply it, and then all apply, or none does and the reload
event names the rank and its reason. Ranks > 0 have usually planned it already: rank 0 posts each
source to the job's store as it reads it, and they plan it on a thread of their own while rank 0
plans and the doorbell brings the exchange forward (workbench/engine/prepare_ahead.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import statistics
import struct
import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.engine.commands.reload import ApplyChanges
from workbench.engine.commands.run_control import InputClosed
from workbench.engine.control_plane import (
    CADENCE,
    CARRIED_VERSION,
    GPU_ALLOCATED,
    GPU_RESERVED,
    LOSS,
    MS,
    ROW,
    RSS,
    STATE,
    STEP,
    STEP_TIME,
    STEPS_PER_SECOND,
    VERSION,
    BoundaryExchange,
    ControlPlane,
    PayloadExchange,
    RankRow,
)
from workbench.engine.dispatch import dispatch, handles
from workbench.engine.doorbell import Doorbell
from workbench.engine.hotswap.planner import ChangeSet, ReloadError
from workbench.engine.hotswap.service import SourceUnchanged
from workbench.engine.memory_guard import MemoryLimitNear
from workbench.engine.planned_turns import END, EVALUATE, SNAPSHOT, PlannedTurns
from workbench.engine.prepare_ahead import PrepareAhead
from workbench.engine.run_state import AUTO_RESUME_REASONS, DATA_EXHAUSTED, RunState, is_error_pause
from workbench.protocol.events import COMMANDS, Command, Error, Ranks, Reload, Step

if TYPE_CHECKING:
    from workbench.engine.distributed import ProcessGroups
    from workbench.engine.worker import TrainingWorker

# How far apart exchanges are while training. Commands do not wait for it when the doorbell gets every rank to an
# earlier turn; it sets how fresh the ranks' rows are (rank 0's `ranks` summary, once a second) and how late rank 0
# streams the other ranks' steps. Each exchange is a gloo collective on every rank beside the training's own: measured
# on 2 cores with 1.5 ms steps (bench/RESULTS.md), steps/s against plain torchrun was 0.81 with exchanges 50 ms apart
# and 0.94-1.00 at 250 ms or 1 s. VRAM_BENCH_EXCHANGE_MS tunes it.
DEFAULT_EXCHANGE_MS = 250
EXCHANGE_SECONDS = float(os.environ.get("VRAM_BENCH_EXCHANGE_MS", DEFAULT_EXCHANGE_MS)) / 1000
MAX_CADENCE = 1000
SUMMARY_SECONDS = 1.0  # how often rank 0 publishes every rank's summary (`ranks` event)
STRAGGLER_FACTOR = 1.2  # a rank whose last step took this many times the median is named the slowest
STEPS_SECONDS = 0.25  # ranks > 0 send the steps they trained at most this often (the socket batches steps so too)
MAX_UNSENT_STEPS = 4096  # ... or when this many are waiting
MAX_STEP_EVENTS_RANKS = 8  # beyond this many ranks, only rank 0's steps are streamed (each rank's own log has all)


@dataclass(frozen=True)
class StepFailure:
    """What a rank says of its failed step (its error event's fields)."""

    message: str
    traceback: str | None = None
    file: str | None = None
    line: int | None = None
    step: int = -1  # the step count when it failed (the failed step is the one after it)
    broken: str | None = None  # why the live state cannot train on as it is (a dead group, a poisoned DDP reducer)
    renew_group: bool = False  # the training group's collective failed: it must be made again


@dataclass(frozen=True)
class Broken:
    """The live state cannot train on as it is: resuming rebuilds it on every rank first."""

    reason: str
    renew_group: bool = False


@dataclass(frozen=True)
class RankPaused(Command):
    """Internal: a rank paused for an error (a raising step, a non-finite loss, out of memory): every rank pauses."""

    rank: int
    reason: str
    message: str
    traceback: str | None = None
    file: str | None = None
    line: int | None = None
    broken: str | None = None
    renew_group: bool = False
    resumes: int = 0  # how many times the ranks had resumed when it failed: one resumed since is dealt with


@dataclass(frozen=True)
class EndRun(Command):
    """Internal: rank 0's stdin is closed and a rank paused for an error or the data's end: nobody can resume, so
    every rank ends."""

    reason: str


@dataclass(frozen=True)
class AgreedSource(Command):
    """Internal: a saved file's source as rank 0 prepared it; every rank prepares it, all apply or none."""

    path: str  # relative to the project folder
    source: str
    manual: bool = False
    unchanged: bool = False  # the file is back to the live code (drops a change held for rebuild)


# Commands that may cross between ranks, by name: the protocol's, and the engine's internal ones.
_WIRE: dict[str, type[Command]] = {
    **{kind.__name__: kind for kind in COMMANDS.values()},
    "MemoryLimitNear": MemoryLimitNear,
    "RankPaused": RankPaused,
    "AgreedSource": AgreedSource,
    "EndRun": EndRun,
    "InputClosed": InputClosed,  # in order with the commands before it, on every rank
}
STATE_CODES = {state: i for i, state in enumerate(RunState)}
STEP_FIELDS = 5  # step, loss, ms, code version, time: one trained step in a payload's binary part
_HEADER = struct.Struct("<II")  # a payload: its JSON part's length and how many step numbers follow it


def pack_payload(commands: list[dict[str, Any]], steps: array) -> bytes:
    """A rank's bytes for an exchange: its commands as JSON, then its steps as float64 (numbers need no text: a
    rank with a 2 ms step sends about 25 of them every exchange)."""
    if not commands and not steps:
        return b""
    text = json.dumps(commands).encode() if commands else b""
    return _HEADER.pack(len(text), len(steps)) + text + steps.tobytes()


def unpack_payload(raw: bytes) -> tuple[list[dict[str, Any]], list[tuple[float, ...]]]:
    """The commands and the step rows of a rank's bytes."""
    if not raw:
        return [], []
    text_length, count = _HEADER.unpack_from(raw)
    start = _HEADER.size + text_length
    commands = json.loads(raw[_HEADER.size : start]) if text_length else []
    numbers = memoryview(raw)[start : start + 8 * count].cast("d").tolist()
    return commands, [tuple(numbers[i : i + STEP_FIELDS]) for i in range(0, len(numbers), STEP_FIELDS)]


def encode(command: Command, worker: TrainingWorker) -> dict[str, Any] | None:
    """A command as JSON for the other ranks; None for what only this rank acts on (run on this rank alone, at once:
    it must make no collective)."""
    if isinstance(command, ApplyChanges):
        change = command.changeset
        if isinstance(change, SourceUnchanged):
            return _as_json(AgreedSource(worker.project.relative(change.path), "", change.manual, unchanged=True))
        if change.module is None:
            return None  # a file the session does not import: rank 0 says so at once (`_post`), nothing to agree on
        return _as_json(AgreedSource(worker.project.relative(change.path), change.new_source))
    if type(command).__name__ not in _WIRE:
        return None
    return _as_json(command)


def _as_json(command: Command) -> dict[str, Any]:
    return {"type": type(command).__name__, "fields": dataclasses.asdict(command)}


def decode(data: dict[str, Any]) -> Command:
    kind = _WIRE.get(str(data.get("type")))
    if kind is None:
        raise ValueError(f"unknown command type {data.get('type')!r} from another rank")
    return kind(**data.get("fields", {}))


class TurnPeriod:
    """How long one loop turn really takes while training, from the turns and the time between exchanges."""

    SMOOTHING = 0.5  # the weight of the newest measurement (a change of step size shows within a few exchanges)

    def __init__(self) -> None:
        self.seconds: float | None = None
        self._last: tuple[int, float] | None = None  # (turn, monotonic time) of the last note while training

    def note(self, turn: int, now: float, running: bool) -> None:
        """At each exchange: the turns since the last one over the time they took. Paused turns (which wait for a
        command) are not training turns: a pause starts the count afresh."""
        last, self._last = self._last, ((turn, now) if running else None)
        if not running or last is None or turn <= last[0]:
            return
        period = (now - last[1]) / (turn - last[0])
        self.seconds = period if self.seconds is None else self.SMOOTHING * period + (1 - self.SMOOTHING) * self.seconds


class Lockstep:
    """The training thread's side of the control plane: one `boundary` call per loop turn."""

    def __init__(self, plane: ControlPlane, groups: ProcessGroups | None = None, doorbell: Doorbell | None = None,
                 ahead: PrepareAhead[ChangeSet] | None = None) -> None:
        self.plane = plane
        self.groups = groups  # to make the groups again after a collective failed
        self.doorbell = doorbell  # brings the next exchange forward when rank 0 has a command (doorbell.py)
        self.ahead = ahead  # ranks > 0 plan a saved file while they train, as rank 0 reads it (prepare_ahead.py)
        self.rank = plane.rank
        self.world_size = plane.world_size
        self._posted: BoundaryExchange | None = None  # the rows posted at an earlier boundary, collected at `_collect_at`
        self._payload: PayloadExchange | None = None  # the bytes posted at the last boundary, collected at this one
        self._unsent_steps = array("d")  # ranks > 0: steps since the last exchange, for rank 0's stream
        self._steps_sent_at = 0.0  # monotonic time of this rank's last payload with steps
        # Rank 0: what its reload thread prepared, by relative path and source (two saves of a file can cross in one
        # exchange, each with its own plan).
        self._prepared: dict[tuple[str, str], ChangeSet] = {}
        self.rows: list[RankRow] = []  # every rank's last row, as of the last collected boundary
        self.idle_wait = 0.1  # rank 0 waits this long for a command while nothing runs
        self._turn = 0  # loop turns so far: the same count on every rank at every exchange
        self._next_exchange = 1  # the turn of the next post
        self._summarized = float("-inf")
        self._posted_turn = 0
        self._collect_at = 0  # the turn the posted exchange is collected (the one after its post)
        self.cadence = 1
        self.turn_period = TurnPeriod()  # rank 0: how long a loop turn takes while training, for the cadence
        # --eval-every, --snapshot-every, --max-steps: the turn every rank does what is due at (planned_turns.py)
        self.planned = PlannedTurns()

    # The loop ---------------------------------------------------------------------------
    def boundary(self, worker: TrainingWorker, block: bool) -> None:
        """Collect the exchange posted a turn ago and run its commands, then post this turn's when one is due.

        Every rank makes the same calls at the same turns: the cadence each uses comes from the exchange it just
        collected, and every rank collected the same one."""
        # Commands a `step` held back, the step now run: they wait for the next exchange, which says whether that
        # step failed on some rank (its report runs first), and it comes at once. Run before it, a `resume` sent with
        # the `step` rebuilt on the rank whose step failed and resumed on the other (a collective mismatch).
        held = bool(worker._after_step) and not worker._step_once
        self._turn += 1
        now = self.doorbell is not None and self.doorbell.at_boundary(self._turn)  # every rank agreed on this turn
        if not now and self.doorbell is not None and self.doorbell.declined and not worker.commands.empty():
            self.doorbell.retry()  # rank 0: some rank was past the proposed turn; a later one, not the cadence's
        if self._payload is not None:  # posted at the last boundary
            payload, self._payload = self._payload, None
            self._deliver(worker, payload.collect(), run_commands=True)
            if worker._quit:
                return
        if self._posted is not None and self._turn >= self._collect_at:
            posted, self._posted = self._posted, None
            self._collect(worker, posted, run_commands=True)
            if worker._quit:
                return
        planned = self.planned.due(self._turn)  # after a step --eval-every or the like names: every rank, at once
        if self._posted is None and (now or held or planned or self._turn >= self._next_exchange):
            self._post(worker, block and self.rank == 0 and not held)
            if now or held or planned:  # a command is waiting: collected at once rather than a turn later
                posted, self._posted = self._posted, None
                # posted after the held step ran; the planned turn's work runs after the ranks' failures, before the rest
                self._collect(worker, posted, run_commands=True, release=held, planned=planned)
                if worker._quit:
                    return

    def finish(self, worker: TrainingWorker) -> None:
        """After the loop (every rank leaves at the same turn): collect what is still posted, then one more exchange
        carries the steps trained since, so rank 0 streams them and no rank waits on a collective nobody finishes."""
        self._settle(worker)
        self._post(worker, block=False, commands_too=False)
        self._settle(worker)
        if self.doorbell is not None:
            self.doorbell.close()
        if self.ahead is not None:
            self.ahead.close()

    def _settle(self, worker: TrainingWorker) -> None:
        """Collect whatever is in flight, rows and then bytes, delivering steps but running no command."""
        if self._payload is not None:
            payload, self._payload = self._payload, None
            self._deliver(worker, payload.collect(), run_commands=False)
        if self._posted is not None:
            posted, self._posted = self._posted, None
            self._collect(worker, posted, run_commands=False)
        if self._payload is not None:
            payload, self._payload = self._payload, None
            self._deliver(worker, payload.collect(), run_commands=False)

    def _post(self, worker: TrainingWorker, block: bool, commands_too: bool = True) -> None:
        """Post this rank's row, with its commands (unless `commands_too` is False: the last exchange, which carries
        every step not sent yet) and, when due, its steps."""
        local = self._drain(worker, block) if commands_too else []
        encoded = [(command, encode(command, worker)) for command in local]
        commands = [item for _, item in encoded if item is not None]
        for command, item in encoded:
            if item is None:  # this rank's alone (a save of a file no rank imports): answered here, no collective
                dispatch(worker, command)
        now = time.monotonic()
        row = self._row(worker)
        steps = array("d")
        if len(self._unsent_steps) == STEP_FIELDS:  # one step since the last exchange: the row has it all
            row[CARRIED_VERSION] = self._unsent_steps[3]
            self._unsent_steps, self._steps_sent_at = array("d"), now
        elif self._unsent_steps and (not commands_too or now - self._steps_sent_at >= STEPS_SECONDS
                                     or len(self._unsent_steps) >= MAX_UNSENT_STEPS * STEP_FIELDS):
            steps, self._unsent_steps, self._steps_sent_at = self._unsent_steps, array("d"), now
        data = pack_payload(commands, steps)
        for command in local:  # rank 0 keeps its own prepared plan rather than planning again
            if isinstance(command, ApplyChanges) and isinstance(command.changeset, ChangeSet):
                changeset = command.changeset
                self._prepared[(worker.project.relative(changeset.path), changeset.new_source)] = changeset
        self._posted = self.plane.post(row, data, commands=bool(commands))
        self._posted_turn, self._collect_at = self._turn, self._turn + 1

    def _collect(self, worker: TrainingWorker, posted: BoundaryExchange, run_commands: bool,
                 release: bool = False, planned: bool = False) -> None:
        """Every rank's row: the summary, the cadence; the bytes, gathered at once when they hold commands, else
        posted when some rank has any. `release`: an exchange posted after a held `step` ran, which holds any
        failure of that step: the commands the step held back run after it (`TrainingWorker.run_in_order`).
        `planned`: the exchange of a planned turn (planned_turns.py), whose work runs among its commands."""
        self.rows = posted.collect()
        if self.rank == 0:
            for row in self.rows:
                if row.carried_version >= 0:
                    self._publish_steps(worker, row.rank, [(row.step, row.loss, row.ms, row.carried_version, row.step_time)])
            self._summarize(worker)
        self.cadence = min(max(self.rows[0].cadence, 1), MAX_CADENCE)
        self._next_exchange = self._posted_turn + self.cadence
        self._plan(worker)
        due: list[Command] = [PlannedDue()] if planned else []  # first among the commands: only failures before it
        if not any(row.payload_bytes for row in self.rows):
            if run_commands and (release or due):
                worker.run_in_order(due, release=release)  # no rank said anything (no failure): the held commands now
            return
        payload = self.plane.post_bytes(posted.payload, [row.payload_bytes for row in self.rows])
        if any(row.commands for row in self.rows):
            self._deliver(worker, payload.collect(), run_commands, release, due)
        else:
            self._payload = payload
            if run_commands and (release or due):
                worker.run_in_order(due, release=release)  # steps only, no command: no rank failed

    def _deliver(self, worker: TrainingWorker, batches: list[bytes], run_commands: bool, release: bool = False,
                 due: list[Command] | None = None) -> None:
        """What every rank said, in rank order: other ranks' steps to rank 0's stream, then the commands dispatched.
        Every rank's steps first: a quit among rank 0's commands ends the loop, and rank 1's steps in the same
        exchange were dropped from the stream (a quit on 2 ranks lost rank 1's last 4 step events)."""
        said = [(sender, unpack_payload(raw)) for sender, raw in enumerate(batches)
                if raw and (self.rank == 0 or run_commands)]
        if self.rank == 0:
            for sender, (_, steps) in said:
                if steps:
                    self._publish_steps(worker, sender, steps)
        if run_commands:
            commands = [decode(item) for _, (commands, _) in said for item in commands]
            # A rank's failure first: it happened before this boundary, and a command of rank 0's in the same exchange
            # (a `step`, a `resume` that rebuilds) was sent not knowing it. After them, it paused the ranks again once
            # they had recovered, on an error already dealt with (minGPT under DDP, ported). Then what a `step` held
            # back, then the rest.
            worker.run_in_order([*(due or []), *commands], release)

    def _configure(self, worker: TrainingWorker) -> bool:
        """What is planned, from the run's options (the same on every rank); False: nothing, or a single rank."""
        if self.world_size == 1:
            return False
        every = {EVALUATE: worker.eval_every if worker.project.function("evaluate") is not None else None,
                 SNAPSHOT: worker.snapshot_every}
        self.planned.every = {kind: n for kind, n in every.items() if n}
        self.planned.last_step = worker.max_steps if worker.exit_at_max_steps else None
        return bool(self.planned.every) or self.planned.last_step is not None

    def _plan(self, worker: TrainingWorker) -> None:
        """From the rows every rank just collected: the turn of the next planned boundary."""
        if self._configure(worker):
            row = self.rows[0]
            self.planned.plan(row.state == STATE_CODES[RunState.RUNNING], row.step, self._posted_turn, self._turn)

    def run_planned(self, worker: TrainingWorker) -> None:
        """The planned turn, its exchange collected (a failure of the step before it has paused every rank): what
        rank 0's step is due for, on every rank, unless they paused for a failure; then the next turn is planned."""
        failed = worker.state is RunState.PAUSED and is_error_pause(worker.pause_reason or "")
        worker.held_for_planned_end = False
        for kind in self.planned.due_after(self.rows[0].step, self._turn):
            if failed:
                break
            if kind == EVALUATE:
                worker._run_evaluate(agreed=True)
            elif kind == SNAPSHOT:
                worker.periodic_snapshot(together=True)
            elif kind == END:
                worker.end_at_max_steps(together=True)
                return
        self._plan(worker)

    def resumed(self, worker: TrainingWorker) -> None:
        """Every rank resumed at this boundary (only commands resume): the next planned turn counts from rank 0's
        step, which stood still since the exchange that carried the command."""
        if self.rows and self._configure(worker):
            self.planned.plan(True, self.rows[0].step, self._turn, self._turn, again=True)

    def after_one_step(self, worker: TrainingWorker) -> None:
        """A `step` sent while paused (every rank, at one boundary): what its step is due for, at the next boundary."""
        if self._configure(worker):
            self.planned.after_one_step(self._turn)

    def ends_at_next_boundary(self) -> bool:
        """After this turn's step, the last of --max-steps: the end planned for the next boundary, which it holds for."""
        return self.planned.next_turn_is_due(self._turn)

    def _drain(self, worker: TrainingWorker, block: bool) -> list[Command]:
        found: list[Command] = []
        try:
            found.append(worker.commands.get(timeout=self.idle_wait) if block else worker.commands.get_nowait())
            while True:
                found.append(worker.commands.get_nowait())
        except queue.Empty:
            pass
        return found

    def _row(self, worker: TrainingWorker) -> list[float]:
        row = [0.0] * ROW
        row[STEP] = float(worker.step)
        row[LOSS] = float(worker.last_loss) if worker.last_loss is not None else float("nan")
        row[MS] = float(worker.step_ms_history[-1]) if worker.step_ms_history else 0.0
        row[VERSION] = float(worker.reloader.version)
        row[STATE] = float(STATE_CODES[worker.state])
        row[STEP_TIME] = worker.last_step_time or 0.0
        row[CARRIED_VERSION] = -1.0
        if self.rank == 0:
            row[CADENCE] = float(self._wanted_cadence(worker))
        row[STEPS_PER_SECOND] = worker.telemetry.steps_per_second() if worker.state is RunState.RUNNING else 0.0
        memory = worker.telemetry.memory
        row[RSS] = float(memory.host.rss) if memory is not None else -1.0
        gpu = next((g for g in memory.gpus if g.index == worker._gpu_index), None) if memory is not None else None
        row[GPU_ALLOCATED] = float(gpu.allocated) if gpu is not None and gpu.allocated is not None else -1.0
        row[GPU_RESERVED] = float(gpu.reserved) if gpu is not None and gpu.reserved is not None else -1.0
        return row

    def _wanted_cadence(self, worker: TrainingWorker) -> int:
        """Rank 0's choice: exchanges about EXCHANGE_SECONDS apart while training, every turn otherwise. A turn is
        the step and everything around it (the loop's bookkeeping, the data, the exchange itself): counted from the
        step's own time alone, exchanges came 30-160% further apart than meant, and a save waited that much longer."""
        running = worker.state is RunState.RUNNING
        self.turn_period.note(self._turn, time.monotonic(), running)
        if self.doorbell is not None:
            self.doorbell.wanted = running
        if not running or not worker.step_ms_history:
            return 1
        seconds = self.turn_period.seconds
        if seconds is None:  # the first exchanges: the step's own time is all there is
            seconds = sorted(worker.step_ms_history)[len(worker.step_ms_history) // 2] / 1000
        if self.doorbell is not None:
            self.doorbell.set_turn_seconds(seconds)
        return max(1, min(MAX_CADENCE, int(EXCHANGE_SECONDS / max(seconds, 1e-6))))

    def renew_groups(self) -> None:
        """Every rank at once (a batch's handler): new default and control groups on a fresh store prefix."""
        if self.groups is None:
            raise RuntimeError("this session does not own its process groups")
        self.plane.group = self.groups.renew()  # closes the old doorbell too
        if self.doorbell is not None:
            self.doorbell = self.groups.doorbell()  # rings again once the next exchange sees training
        if self.ahead is not None:
            self.ahead = self.groups.prepare_ahead(self.ahead.prepare)

    def _summarize(self, worker: TrainingWorker) -> None:
        """Rank 0, at most once a second: every rank's numbers as a `ranks` event, the straggler named."""
        now = time.monotonic()
        if now - self._summarized < SUMMARY_SECONDS:
            return
        self._summarized = now
        states = list(RunState)
        ranks = tuple(
            {"rank": row.rank, "step": row.step, "steps_per_second": round(row.steps_per_second, 3), "loss": row.loss,
             "step_ms": round(row.ms, 3), "code_version": row.code_version,
             "state": states[row.state].value if 0 <= row.state < len(states) else "unknown",
             "rss_bytes": row.rss if row.rss >= 0 else None,
             "gpu_allocated_bytes": row.gpu_allocated if row.gpu_allocated >= 0 else None,
             "gpu_reserved_bytes": row.gpu_reserved if row.gpu_reserved >= 0 else None}
            for row in self.rows
        )
        worker.bus.publish(Ranks(ranks=ranks, slowest=straggler(self.rows)))

    def record_step(self, step: int, loss: float, ms: float, code_version: int, at: float) -> None:
        """Ranks > 0, after each step: kept for rank 0's stream until the next exchange (up to 8 ranks)."""
        if self.rank != 0 and self.world_size <= MAX_STEP_EVENTS_RANKS:
            self._unsent_steps.extend((step, loss, ms, code_version, at))

    @staticmethod
    def _publish_steps(worker: TrainingWorker, rank: int, rows: list[tuple[float, ...]]) -> None:
        """On rank 0: another rank's steps as `step` events carrying its rank (an exchange late)."""
        for step, loss, ms, code_version, at in rows:
            worker.bus.publish(Step.quick(int(step), float(loss), float(ms), {}, int(code_version), rank=rank,
                                          time=float(at)))

    def plan_for(self, path: str, source: str) -> ChangeSet | None:
        """The plan already made for exactly this source: rank 0's own (its reload thread's), or one a rank > 0 made
        ahead (waiting for it if it is being made); None: plan it now."""
        own = self._prepared.pop((path, source), None)
        if own is not None:
            return own
        return self.ahead.take(path, source) if self.ahead is not None else None

    # A rank's own failure --------------------------------------------------------------------
    def announce_pause(self, worker: TrainingWorker, reason: str, failure: StepFailure) -> None:
        """A pause this rank decided alone (its step failed): every rank pauses at the next agreed boundary."""
        worker.commands.put(RankPaused(self.rank, reason, failure.message, failure.traceback, failure.file, failure.line,
                                       failure.broken, failure.renew_group, worker.resumes))

    def end_run(self, worker: TrainingWorker, reason: str) -> None:
        """Rank 0, with nobody left to resume: every rank ends at the next agreed boundary (exit code 1; 0 and a final
        snapshot when the data ran out)."""
        worker.commands.put(EndRun(reason))


@dataclass(frozen=True)
class PlannedDue(Command):
    """Internal, made by every rank alike: the turn planned for --eval-every, --snapshot-every or --max-steps, among
    its exchange's commands (planned_turns.py)."""


@handles(PlannedDue)
def planned_due(worker: TrainingWorker, command: PlannedDue) -> None:
    if worker.lockstep is not None:
        worker.lockstep.run_planned(worker)


@handles(RankPaused)
def rank_paused(worker: TrainingWorker, command: RankPaused) -> None:
    """Every rank pauses with the failing rank's reason, so saving a fix resumes them all. A failure the ranks have
    resumed from since (a fix saved, `resume`) reached rank 0 late, behind a rank held in a training collective: it
    is said, and pauses nothing (it paused every rank again, on an error already fixed: minGPT under DDP, ported)."""
    if command.resumes < worker.resumes:
        if worker.lockstep is not None and worker.lockstep.rank == 0 and command.rank != 0 \
                and not _same_words(worker._failure.message, command.message):  # rank 0 said it of its own step
            worker.bus.publish(Error(where="step", message=f"rank {command.rank}, before the ranks resumed: "
                                     f"{command.message}", file=command.file, line=command.line,
                                     traceback=command.traceback))
        return
    if command.broken is not None:  # every rank agrees the state needs a rebuild (and maybe new groups) to go on
        renew = command.renew_group or (worker.broken is not None and worker.broken.renew_group)
        worker.broken = Broken(command.broken, renew)
    paused_by_user = worker.state is RunState.PAUSED and not is_error_pause(worker.pause_reason or "")
    if worker.state is RunState.RUNNING or paused_by_user:
        # Paused by the user (a `step` ran while paused, and failed on that rank): every rank's pause is for this
        # failure now, so a `resume` rebuilds on every rank alike (it rebuilt on the failed rank alone, and resumed
        # on the others: a collective mismatch).
        worker._pause(command.reason, announce=False)
    elif worker.exit_on_error_pause and worker.lockstep is not None:
        worker.lockstep.end_run(worker, command.reason)
    if worker.lockstep is not None and worker.lockstep.rank == 0 and command.rank != 0 and not _said(worker, command):
        where = "data" if command.reason == DATA_EXHAUSTED else "step"
        worker.bus.publish(Error(where=where, message=f"rank {command.rank}: {command.message}", file=command.file,
                                 line=command.line, traceback=command.traceback))


def _said(worker: TrainingWorker, command: RankPaused) -> bool:
    """Rank 0 failed the same way at the same step (every rank ran the same new code): its own error says it."""
    own = worker._failure
    return bool(own.message) and own.step == worker.step and _same_words(own.message, command.message)


def _same_words(own: str, other: str) -> bool:
    """Two ranks' failure messages that say the same, but for the rank each names."""
    return own.split(" for rank")[0] == other.split(" for rank")[0]


@handles(EndRun)
def end_run(worker: TrainingWorker, command: EndRun) -> None:
    worker.end_without_input(command.reason)  # at the same boundary on every rank: a final snapshot can be sharded


@handles(AgreedSource)
def agreed_source(worker: TrainingWorker, command: AgreedSource) -> None:
    """Prepare the same plan on every rank; apply it everywhere or nowhere."""
    lockstep = worker.lockstep
    assert lockstep is not None, "AgreedSource only crosses between ranks"
    path = (worker.project.root / command.path).resolve()
    if command.unchanged:
        dispatch(worker, ApplyChanges(SourceUnchanged(path, time.monotonic(), command.manual)))
        return
    changeset = lockstep.plan_for(command.path, command.source)
    problem: str | None = None
    if changeset is None:
        if lockstep.rank != 0:
            # Every change before this one is applied (or dropped) by now: plan against the live code, not against a
            # source this rank planned ahead that rank 0 never sent (it failed there, or a later read replaced it).
            worker.reloader.forget_prepared(path)
        try:
            changeset = worker.reloader.prepare(path, source=command.source)
        except ReloadError as exc:
            problem = exc.message
        except Exception as exc:  # noqa: BLE001 - a rank that cannot plan says why; nobody applies
            problem = f"{type(exc).__name__}: {exc}"
    outcomes = lockstep.plane.gather_text(problem)  # one collective when no rank objects
    failed = [(rank, why) for rank, why in enumerate(outcomes) if why is not None]
    if failed:
        if changeset is not None:
            worker.reloader.forget_prepared(path)
        if lockstep.rank == 0:
            named = "; ".join(f"rank {rank}: {why}" for rank, why in failed)
            worker.bus.publish(Reload(ok=False, file=command.path, error=f"{named}. Nothing was applied on any rank; "
                                      "the old code keeps running everywhere", code_version=worker.reloader.version))
        return
    if changeset is None:
        return  # the source equals the live code on every rank
    version_before = worker.reloader.version
    dispatch(worker, ApplyChanges(changeset))
    applied = worker.reloader.version != version_before
    agreed = [why is None for why in lockstep.plane.gather_text(None if applied else "not applied")]
    if any(agreed) and not all(agreed):
        if applied:
            worker.reloader.undo_last_commit()
        if lockstep.rank == 0:
            missing = ", ".join(str(rank) for rank, ok in enumerate(agreed) if not ok)
            worker.bus.publish(Reload(ok=False, file=command.path, error=f"rank {missing} could not apply the change; it was "
                                      "undone on every rank, so all run the old code", code_version=worker.reloader.version))


def straggler(rows: list[RankRow]) -> int | None:
    """The rank whose last step was slowest, when it is clearly slower than the median rank's (else None)."""
    timed = [row for row in rows if row.ms > 0]
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda row: row.ms)
    return slowest.rank if slowest.ms > STRAGGLER_FACTOR * statistics.median(row.ms for row in timed) else None
