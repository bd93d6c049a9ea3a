"""Where every rank is while one holds the job up, told through the job's store rather than a collective.

A rank stuck in its step (a hung data loader, an endless loop) keeps every other rank waiting inside the
next collective, and a rank whose step raised before DDP's all-reduce leaves the others waiting in it until
the training group's timeout (--collective-timeout, 5 minutes by default). No collective can carry the news
then, and rank 0's own stream would say nothing, or only that its own step is slow. So each rank held up for
longer than TELL_SECONDS writes its place into the job's c10d store (one key per rank, refreshed while held,
removed when it moves on): which step, which line of the project, inside what, how much CPU its training
thread uses. Rank 0 reads them once it is held up itself, and says in one `waiting` warning which rank is
where: at once when another rank's step failed, else when the wait is as long as a slow step's. The same holds
for the `evaluate()` every rank runs at once (the `evaluate` command, --eval-every): a collective some ranks run in
it and others do not leaves the first waiting for partners that finished theirs, and the report says so.

`i` (interrupt) reaches every held rank the same way: a counter in the store, read by held ranks only, so a
rank stuck in an endless loop on another node can be stopped from rank 0's app.
"""

from __future__ import annotations

import json
import linecache
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import workbench
from workbench.engine.run_state import DATA_EXHAUSTED, RunState, is_error_pause
from workbench.engine.suspension import SuspendedTime
from workbench.protocol.events import Error, Event

if TYPE_CHECKING:
    import torch.distributed as dist

    from workbench.engine.worker import TrainingWorker

TELL_SECONDS = 1.0  # held this long (and 3x a median step, in a step), a rank writes its place
REFRESH_SECONDS = 2.0  # how often a held rank writes it again (its seconds and CPU move on)
STALE_SECONDS = 10.0  # a place not refreshed for this long is from a rank that stopped telling (gone, or stopped)
STORE_TIMEOUT = timedelta(seconds=10)  # the board's store calls: a store that stops answering is not waited on long
REPORT_AGAIN_SECONDS = 60.0  # rank 0 repeats its report this often while the wait goes on
_PACKAGE = os.path.dirname(workbench.__file__)
_TORCH_PARTS = (os.sep + "torch" + os.sep, os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
IN_USER_CODE = ("step", "evaluate")  # places inside the user's code: `i` may stop them


@dataclass(frozen=True)
class Place:
    """One rank's place, as it wrote it: what its training thread is doing and for how long."""

    rank: int
    # "step" (inside the user's step), "evaluate" (inside the user's evaluate(), run by every rank at once),
    # "evaluated" (done with it, waiting for the others' counts), "exchange" (vram-bench's exchange between steps),
    # "paused", "between"
    kind: str
    step: int  # steps this rank has finished
    seconds: float  # how long it has been there
    frame: str | None = None  # the innermost line of the project: "train.py:25 in load_batch"
    code: str | None = None  # that line's text
    inside: str | None = None  # the innermost frame beyond the project (torch, a library): "torch/autograd/graph.py:829"
    cpu: float | None = None  # the training thread's share of a core since the last look (0.98: computing; 0: waiting)
    failure: str | None = None  # a paused rank's reason: its failed step's message
    at: float = 0.0  # wall time it was written
    reason: str | None = None  # a paused rank's pause reason (`error`, `data exhausted`, ...)

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @classmethod
    def from_json(cls, text: str | bytes) -> Place:
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def describe(place: Place, now: float | None = None, ranks: list[int] | None = None) -> str:
    """One rank's place in words, for the `waiting` warning; `ranks`: the ranks at the same place, said once."""
    now = time.time() if now is None else now
    group = ranks is not None and len(ranks) > 1
    age = max(0.0, now - place.at) if place.at else 0.0
    seconds = place.seconds + age
    if place.kind == "step":
        what = f"in step {place.step + 1} for {_duration(seconds)}"
    elif place.kind == "evaluate":
        what = f"in evaluate() for {_duration(seconds)}"
    elif place.kind == "evaluated":
        what = f"done with evaluate(), waiting {_duration(seconds)} for the other ranks to finish theirs"
    elif place.kind == "exchange":
        what = f"waiting for the other ranks between steps {place.step} and {place.step + 1} for {_duration(seconds)}"
    elif place.kind == "paused":
        what = f"paused after step {place.step}" + (f": {place.failure}" if place.failure else "")
        what += f" ({place.frame})" if place.frame and place.frame not in (place.failure or "") else ""
    else:
        what = f"between steps {place.step} and {place.step + 1}"
    if place.frame and place.kind != "paused":
        what += f", at {place.frame}" + (f" (`{place.code}`)" if place.code else "")
    if place.inside and place.kind in IN_USER_CODE:
        what += f", inside {place.inside}"
    if place.cpu is not None and place.kind in (*IN_USER_CODE, "exchange"):
        what += f", {'busy' if place.cpu >= 0.5 else 'idle'}" + ("" if group else f" ({place.cpu:.0%} of a core)")
    if age > STALE_SECONDS:
        what += f" (as it said {_duration(age)} ago; it has said nothing since: gone, or stopped?)"
    return f"{rank_list(ranks) if group else f'rank {place.rank}'}: {what}"  # type: ignore[arg-type]


def describe_all(places: dict[int, Place], world_size: int, now: float | None = None) -> list[str]:
    """Every rank's place, rank 0 first; ranks > 0 at the same place (the same kind, step, line, library, busy or
    idle, failure) said once, so 64 ranks waiting in the same all-reduce are one line, not 64."""
    now = time.time() if now is None else now
    lines = [describe(places[0], now)] if 0 in places else []
    groups: dict[tuple[object, ...], list[Place]] = {}
    for rank, place in sorted(places.items()):
        if rank == 0:
            continue
        busy = None if place.cpu is None else place.cpu >= 0.5
        stale = place.at > 0 and now - place.at > STALE_SECONDS
        key = (place.kind, place.step, place.frame, place.code, place.inside, busy, place.failure, stale)
        groups.setdefault(key, []).append(place)
    for members in groups.values():
        slowest = max(members, key=lambda p: p.seconds)
        lines.append(describe(slowest, now, [p.rank for p in members]))
    silent = [r for r in range(1, world_size) if r not in places]
    if silent:
        lines.append(f"{rank_list(silent) if len(silent) > 1 else f'rank {silent[0]}'}: not held up (training, or "
                     "between steps)")
    return lines


def waited_for(own: Place, places: dict[int, Place]) -> str | None:
    """A few words for the status bar: the rank rank 0 waits for, and why; None when rank 0 is itself the busy one."""
    others = [p for r, p in sorted(places.items()) if r != 0]
    failed = [p for p in others if p.failure]
    if failed:
        return f"rank {failed[0].rank} ({'its data ran out' if failed[0].reason == DATA_EXHAUSTED else 'its step failed'})"
    busy = [p for p in others if p.kind in IN_USER_CODE and p.cpu is not None and p.cpu >= 0.5]
    if busy:
        return f"rank {busy[0].rank} (busy at {busy[0].frame})" if busy[0].frame else f"rank {busy[0].rank} (busy)"
    if own.kind in IN_USER_CODE and own.cpu is not None and own.cpu >= 0.5:
        return None  # rank 0's own step (or evaluate()) is the long one: slow, not a wait
    return "the other ranks"


def rank_list(ranks: list[int]) -> str:
    """ranks 2-5, 7"""
    spans: list[str] = []
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return "ranks " + ", ".join(spans)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def _short_duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def frames_of(thread_id: int, owns: Callable[[str], bool], relative: Callable[[str], str],
              source: Callable[[str], str | None] = lambda filename: None) -> tuple[str | None, str | None, str | None, bool]:
    """(innermost project line, its code, the innermost frame beyond the project, whether vram-bench's exchange holds
    the thread) of a running thread, from its Python stack. `source(filename)`: the text the running code was compiled
    from, when the file on disk may be ahead of it (a save not applied yet)."""
    frame: FrameType | None = sys._current_frames().get(thread_id)
    inside: str | None = None
    in_exchange = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if owns(filename):
            code = _line_text(filename, frame.f_lineno, source(filename))
            return f"{relative(filename)}:{frame.f_lineno} in {frame.f_code.co_name}", code, inside, in_exchange
        if filename.startswith(_PACKAGE):
            if filename.endswith(("control_plane.py", "doorbell.py")):
                in_exchange = True
        elif inside is None:
            inside = f"{_short(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None, None, inside, in_exchange


def _short(filename: str) -> str:
    """A library's file from its package on: torch/autograd/graph.py."""
    for part in _TORCH_PARTS:
        if part in filename:
            tail = filename.rsplit(part, 1)[1]
            return ("torch" + os.sep + tail) if part == _TORCH_PARTS[0] else tail
    return filename


def _line_text(filename: str, line: int, source: str | None) -> str | None:
    if source is not None:
        lines = source.splitlines()
        text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    else:
        linecache.checkcache(filename)  # not the lines of an earlier read of a file saved since
        text = linecache.getline(filename, line).strip()
    return text[:80] or None


def takes_interrupt(place: Place) -> bool:
    """Whether `i` should stop this held rank's step: not when it waits idle inside a library (torch's collective,
    most likely, waiting for the rank that is stuck). Interrupted there, it would report an interrupt in place of the
    collective's own error, which says the training group is dead and must be made again."""
    return place.kind in IN_USER_CODE and not (place.inside is not None and (place.cpu or 0.0) < 0.5)


class ThreadCpu:
    """A thread's CPU share between two looks (its own CPU clock: waiting in a collective is ~0, a busy loop ~1)."""

    def __init__(self, thread_id: int) -> None:
        try:
            self._clock: int | None = time.pthread_getcpuclockid(thread_id)
        except (AttributeError, OSError):  # not every platform has per-thread clocks
            self._clock = None
        self._last: tuple[float, float] | None = None

    def share(self) -> float | None:
        if self._clock is None:
            return None
        try:
            now, used = time.monotonic(), time.clock_gettime(self._clock)
        except OSError:  # the thread ended
            return None
        last, self._last = self._last, (now, used)
        if last is None or now - last[0] <= 0:
            return None
        return max(0.0, min(1.0, (used - last[1]) / (now - last[0])))


class Board:
    """The ranks' places in the job's store: `place/<rank>` (JSON), and `interrupts`, a counter rank 0 raises."""

    def __init__(self, store: dist.Store, rank: int, world_size: int) -> None:
        self.store = store.clone()  # one client answers one request at a time: this board's thread has its own
        self.store.set_timeout(STORE_TIMEOUT)  # a store that stops answering never holds a watchdog or a key press long
        self.rank = rank
        self.world_size = world_size
        self._told = False

    def tell(self, place: Place) -> None:
        self.store.set(f"place/{self.rank}", place.to_json())
        self._told = True

    def forget(self) -> None:
        if self._told:
            self.store.delete_key(f"place/{self.rank}")
            self._told = False

    def places(self) -> dict[int, Place]:
        found: dict[int, Place] = {}
        for rank in range(self.world_size):
            key = f"place/{rank}"
            if self.store.check([key]):
                try:
                    found[rank] = Place.from_json(self.store.get(key))
                except (ValueError, TypeError, KeyError):
                    continue  # half-written or from another version: not worth a wrong report
        return found

    def interrupt(self) -> int:
        return self.store.add("interrupts", 1)

    def interrupts(self) -> int:
        return self.store.add("interrupts", 0)


class RankWatch:
    """One rank's side, called from its watchdog thread every half second: tell while held, interrupt when asked,
    and (rank 0) report every rank's place. Nothing touches the store while no rank is held."""

    def __init__(self, worker: TrainingWorker, board: Board, publish: Callable[[Event], None], *, slow_factor: float,
                 slow_seconds: float, collective_timeout: float) -> None:
        self._worker = worker
        self._board = board
        self._publish = publish
        self._slow_factor = slow_factor
        self._slow_seconds = slow_seconds
        self._collective_timeout = collective_timeout
        self._cpu: ThreadCpu | None = None
        self._told_at = float("-inf")
        self._interrupts_seen: int | None = None
        self._reported: tuple[float, frozenset[tuple[int, str, str]]] | None = None  # when, and what it said
        self._exchange_since: float | None = None  # when this rank was first seen waiting in an exchange
        self._last_place: Place | None = None  # as of the last tick, while held
        self.held: str | None = None  # rank 0, while its report stands: what it waits for, for the status bar
        self._suspended: SuspendedTime | None = None

    @property
    def reports(self) -> bool:
        """Rank 0's watch says what a slow-step warning would, with every rank's place."""
        return self._board.rank == 0

    def tick(self, suspended: SuspendedTime | None = None) -> None:
        """`suspended`: the watchdog's record of time the whole process was stopped (SIGSTOP, ctrl+z), which no rank
        spent holding another up."""
        self._suspended = suspended
        worker = self._worker
        if worker.ident is None:
            return
        if self._cpu is None:
            self._cpu = ThreadCpu(worker.ident)
        cpu = self._cpu.share()
        now = time.monotonic()
        place = self._place(now, cpu)  # None at once in the common case: inside a step shorter than TELL_SECONDS
        held = place is not None and self._held(place)
        self._last_place = place if held else None
        if held:
            assert place is not None
            if now - self._told_at >= REFRESH_SECONDS:
                self._board.tell(place)
                self._told_at = now
            if place.kind in IN_USER_CODE:
                self._check_interrupt(place)
        else:
            self._board.forget()
            self._told_at = float("-inf")
            self._interrupts_seen = None
        if self.reports:
            self._report(place if held else None, now)

    # One rank ---------------------------------------------------------------------------------
    def _place(self, now: float, cpu: float | None) -> Place | None:
        """This rank's place, or None when it is plainly not held (inside a step shorter than the tell threshold)."""
        worker = self._worker
        rank, started = self._board.rank, worker.step_started
        if started is not None:
            self._exchange_since = None
            seconds = now - started - self._stopped_since(started)
            if seconds < TELL_SECONDS or seconds < 3 * self._median_step():
                return None
            frame, code, inside, _ = self._frames()
            return Place(rank, "step", worker.step, seconds, frame, code, inside, cpu, None, time.time())
        evaluation = worker.evaluation_since
        if evaluation is not None:  # every rank runs evaluate() at once (the `evaluate` command, --eval-every)
            self._exchange_since = None
            seconds = now - evaluation - self._stopped_since(evaluation)
            if seconds < TELL_SECONDS:
                return None
            frame, code, inside, _ = self._frames()
            kind = "evaluate" if worker.evaluate_started is not None else "evaluated"
            return Place(rank, kind, worker.step, seconds, frame, code, inside, cpu, None, time.time())
        frame, code, _, in_exchange = self._frames()
        self._exchange_since = (self._exchange_since or now) if in_exchange else None
        since = self._exchange_since
        seconds = now - since - self._stopped_since(since) if since is not None else 0.0
        failure = worker._failure
        if worker.state is RunState.PAUSED and worker.pause_reason is not None and is_error_pause(worker.pause_reason) \
                and failure is not None and failure.step == worker.step:
            where = f"{failure.file}:{failure.line}" if failure.file else None
            return Place(rank, "paused", worker.step, seconds, where, None, None, cpu, failure.message, time.time(),
                         worker.pause_reason)
        if self._exchange_since is not None and worker.state is RunState.RUNNING:
            return Place(rank, "exchange", worker.step, seconds, frame, code, None, cpu, None, time.time())
        return None

    def _stopped_since(self, moment: float) -> float:
        return self._suspended.since(moment) if self._suspended is not None else 0.0

    def _held(self, place: Place) -> bool:
        if place.kind == "step":
            return True  # _place made it only past the threshold
        if place.kind == "paused":
            return True  # a failed step: the others may wait for this rank in a collective it will not join
        return place.seconds >= TELL_SECONDS

    def _frames(self) -> tuple[str | None, str | None, str | None, bool]:
        project, reloader = self._worker.project, self._worker.reloader
        return frames_of(self._worker.ident, project.owns, project.relative,  # type: ignore[arg-type]
                         lambda filename: reloader.applied_source(Path(filename)))

    def _median_step(self) -> float:
        history = list(self._worker.step_ms_history)
        return statistics.median(history) / 1000 if history else 0.0

    def _check_interrupt(self, place: Place) -> None:
        count = self._board.interrupts()
        if self._interrupts_seen is None:
            self._interrupts_seen = count
        elif count > self._interrupts_seen:
            self._interrupts_seen = count
            if takes_interrupt(place):
                self._worker.interrupt()

    def interrupt_here(self) -> bool:
        """Rank 0's own share of `i`: its step, unless it waits inside a library (a collective, most likely)."""
        place = self._last_place
        if place is not None and not takes_interrupt(place):
            return False
        return self._worker.interrupt()

    # Rank 0 -----------------------------------------------------------------------------------
    def _report(self, own: Place | None, now: float) -> None:
        """Rank 0, held in a step or an exchange: every rank's place, at once when another rank failed, else once the
        hold is as long as a slow step; again when a rank's place changes kind or every REPORT_AGAIN_SECONDS."""
        if own is None or own.kind == "paused":
            self._reported, self.held = None, None  # this rank's own failure is said by its own error
            return
        places = self._board.places()
        places[0] = own
        failed = [p for r, p in sorted(places.items()) if r != 0 and p.failure]
        evaluating = own.kind in ("evaluate", "evaluated")  # no median to compare with: the slow step's minimum
        slow = own.seconds >= max(self._slow_seconds, 0.0 if evaluating else self._slow_factor * self._median_step())
        if not failed and not slow:
            return
        said = frozenset((p.rank, p.kind, p.failure or "") for p in places.values())
        if self._reported is not None and said == self._reported[1] and now - self._reported[0] < REPORT_AGAIN_SECONDS:
            return
        self._reported = (now, said)
        self.held = waited_for(own, places)
        if own.kind == "step":
            median = self._median_step()
            headline = f"step {own.step + 1} has run for {_duration(own.seconds)} on rank 0" + (
                f" ({own.seconds / median:.0f}x its median, {_short_duration(median)})" if median > 0 else "")
        elif evaluating:
            headline = f"the ranks' evaluate() has run for {_duration(own.seconds)} (after step {own.step})"
        else:
            headline = f"rank 0 has waited {_duration(own.seconds)} for the other ranks between steps"
        lines = describe_all(places, self._board.world_size)
        self._publish(Error(where="waiting", message=f"{headline}. Where each rank is: " + "; ".join(lines) + ". "
                            + self._advice(own, failed, places)))

    def _advice(self, own: Place, failed: list[Place], places: dict[int, Place]) -> str:
        left = self._collective_timeout - own.seconds
        timeout = (f"a training collective gives up after --collective-timeout ({_duration(self._collective_timeout)}"
                   + (f", about {_duration(left)} from now" if left > 0 else "") + "); then every rank pauses, and "
                   "resuming makes the process groups again")
        if failed:
            return (f"Ranks waiting inside a collective wait for rank {failed[0].rank}, which will not join it: {timeout}. "
                    "Save a fix meanwhile; it applies when they pause.")
        interrupt = "If a rank is stuck, press i (command `interrupt`): it reaches every rank held in a step."
        if own.kind in ("evaluate", "evaluated"):
            return evaluate_advice(places, timeout)
        if own.kind == "exchange":  # vram-bench's own exchange: it waits for every rank as long as a step may take
            return interrupt
        return f"{interrupt} Otherwise {timeout}."


def evaluate_advice(places: dict[int, Place], timeout: str) -> str:
    """Rank 0 held in the ranks' evaluate(): most likely a collective that some ranks ran in it and others did not."""
    inside = sorted(r for r, p in places.items() if p.kind == "evaluate")
    done = sorted(r for r, p in places.items() if p.kind == "evaluated")
    waiting = [places[r] for r in inside if places[r].inside is not None and (places[r].cpu or 0.0) < 0.5]
    if not done or not waiting:
        return "If a rank is stuck in it, press i (command `interrupt`): it stops evaluate() on every rank held in it."
    return (f"{_ranks(inside)} {'waits' if len(inside) == 1 else 'wait'} inside {waiting[0].inside} for {_ranks(done)}, "
            "which finished evaluate() without that collective: every rank must run the same collectives in "
            "evaluate() (under FSDP or DDP a forward runs them: run it on every rank, not only where bench.is_main). "
            f"{timeout[0].upper()}{timeout[1:]}.")


def _ranks(ranks: list[int]) -> str:
    return rank_list(ranks) if len(ranks) > 1 else f"rank {ranks[0]}"
