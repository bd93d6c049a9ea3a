"""The training thread: owns the user's state and runs `step` back to back.

Everything that touches the live model happens here, between two steps: code
reloads, cleanup, snapshots, profiling. Commands arrive through a queue and each
runs through `workbench.engine.dispatch.dispatch` (its handler lives in `workbench/engine/commands/`);
events leave through the bus. Nothing here ever waits for a front end.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workbench
from workbench.engine.actions.final_snapshot import FinalSnapshot
from workbench.engine.actions.memory_snapshot import dump_snapshot, start_recording
from workbench.engine.actions.optimizer_settings import Settings, settings_of
from workbench.engine.actions.pending_optimizers import PendingOptimizers
from workbench.engine.actions.profile import ProfileRun
from workbench.engine.actions.requeue import requeue_job
from workbench.engine.actions.snapshot import (
    DEFAULT_KEEP,
    apply_snapshot,
    load_snapshot,
    write_snapshot,
)
from workbench.engine.actions.sharded_snapshot import has_fsdp1, is_sharded, load_sharded, read_facts, read_loader_places, write_sharded
from workbench.engine.code_on_record import KEY as CODE_KEY, record as code_record, resume_notes as code_notes
from workbench.engine.actions.snapshot_integrity import payload_bytes
from workbench.engine.bench import Bench
from workbench.engine.commands import ApplyChanges  # registers the handlers
from workbench.engine.data_end import data_ran_out_message
from workbench.engine.fresh_iterators import fresh_iterator_notes
from workbench.engine import random_states
from workbench.engine.training_tensors import TrainingTensors, put_back as put_back_tensors
from workbench.engine.actions.sharded_states import replicated_paths, tensors_and_layout
from workbench.engine.loader_places import LAYOUT, LOADER, EpochCheck, PutBack, find_loaders, places
from workbench.engine.loader_places import differing, fingerprints, kept_state_bytes, left_out, pack as pack_places, put_back as put_back_places, record as loader_record
from workbench.engine.loader_places import unpack as unpack_places
from workbench.engine.generator_end import ended_by_error, ended_in_state, ended_sentence, generators_ended
from workbench.engine.dispatch import dispatch
from workbench.errors import UserError
from workbench.engine.eval_mode import EvalModeWatch
from workbench.protocol.eventbus import EventBus
from workbench.protocol.events import (
    Command,
    Rebuild,
    Error,
    Evaluate,
    Evaluation,
    Exit,
    MemorySnapshotTaken,
    Paused,
    Profile,
    Quit,
    Resumed,
    ResumeLoaded,
    Setup,
    Step,
    StepOnce,
)
from workbench.engine.hotswap.patches import RunInNamespace
from workbench.engine.hotswap.planner import ChangeSet
from workbench.engine.hotswap.reloader import Reloader
from workbench.engine.hotswap.syntax_trees import format_traceback
from workbench.engine.init_skipping import InitLog, settled_notes, skipping_init
from workbench.engine.ddp_diagnosis import is_unused_parameter_error, unused_parameter_sentence
from workbench.engine.distributed import broadcast_replicated_state, is_dead_group_error, setup_error_hint
from workbench.engine.loader_failure import raised_in_data_loader
from workbench.engine.control_plane import RanksLost
from workbench.engine.lockstep import Broken, Lockstep, StepFailure, is_error_pause
from workbench.engine.memory.device import DeviceProbe
from workbench.engine.stale_frames import true_stack
from workbench.engine.thread_device import use_on_this_thread
from workbench.engine.memory.gc_freeze import Frozen, collect_all, freeze_survivors
from workbench.engine.memory.gc_freeze import release as release_frozen
from workbench.engine.memory.out_of_memory import is_out_of_memory
from workbench.engine.collective_count import mismatch_sentence, training_operations
from workbench.engine.nonfinite import describe_non_finite
from workbench.engine.uninitialized import WHERE as UNINITIALIZED
from workbench.engine.uninitialized import suspect_parameters, warning_sentence
from workbench.engine.output import OutputRouter
from workbench.engine.project import Project, deepest_frame_in
from workbench.engine.rebuild import restore_globals
from workbench.engine.setup_rebinds import SetupRebinds, copies
from workbench.engine.training_globals import TrainingGlobals, put_back, shown, state_namespace
from workbench.engine.run_state import AUTO_RESUME_REASONS, DATA_EXHAUSTED, ENDS_RUN_WITHOUT_INPUT, RunState
from workbench.engine.scheduler_carry import AsMade, as_made
from workbench.engine.runs import RunRecord
from workbench.engine.saved_bytes import SavedBytes
from workbench.engine.step_values import StepOutputError, StepRecord, scalar_now, start_reading
from workbench.engine.state_walk import find_with_globals
from workbench.engine.telemetry import Telemetry
from workbench.engine.thread_priority import lower_current_thread
from workbench.engine.time_limit import ASSUMED_WRITE_SECONDS_PER_BYTE, TimeLimit

__all__ = ["AUTO_RESUME_REASONS", "ApplyChanges", "RunState", "TrainingWorker"]

RUN_FIRST = {"RankPaused": 0, "PlannedDue": 1}  # of an exchange's commands, these run before the rest, in this order


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in that thread at its next bytecode; None cancels one still pending.

    Cancelling is done only when an interrupt is pending: on CPython 3.11, cancelling while a profiler is
    active in that thread (cProfile inside the user's step) makes its next Python call spin forever.
    """
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class CommandQueue(queue.SimpleQueue):  # type: ignore[type-arg]
    """The training thread's commands. `on_put` hears of each as it is queued, on the queuing thread: under
    torchrun, the rank's doorbell (workbench/engine/doorbell.py), so the ranks exchange sooner than the cadence."""

    on_put: Callable[[], None] | None = None

    def put(self, item: Command, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if self.on_put is not None:
            self.on_put()


class TrainingWorker(threading.Thread):
    def __init__(
        self,
        project: Project,
        bench: Bench,
        reloader: Reloader,
        bus: EventBus,
        telemetry: Telemetry,
        probe: DeviceProbe,
        router: OutputRouter | None,
        *,
        max_steps: int | None,
        exit_at_max_steps: bool,
        exit_on_setup_failure: bool,
        start_paused: bool,
        eval_every: int | None = None,
        snapshot_every: int | None = None,
        record_memory: bool = False,
        resume: Path | None = None,
        resume_partial: bool = False,
        snapshot_keep: int = DEFAULT_KEEP,
        run_record: RunRecord | None = None,
        time_limit: TimeLimit | None = None,
        requeue: bool = False,
        on_memory_limit: str = "snapshot",
        freeze_gc: bool = True,
        nice: int = 0,
    ) -> None:
        super().__init__(name="vram-bench-training", daemon=True)
        self.project = project
        self.bench = bench
        self.reloader = reloader
        self.bus = bus
        self.telemetry = telemetry
        self.probe = probe
        self.router = router
        self.commands = CommandQueue()
        self.max_steps = max_steps
        self.stopping_on_signal = False  # set by a signal's quit: the signal may have ended the DataLoader's workers too
        self.exit_at_max_steps = exit_at_max_steps
        self.exit_on_setup_failure = exit_on_setup_failure
        self.start_paused = start_paused
        self.eval_every = eval_every
        self.snapshot_every = snapshot_every  # --snapshot-every: a snapshot after every Nth step
        self.record_memory = record_memory
        self.resume_path = resume
        self.resume_partial = resume_partial
        self.snapshot_keep = snapshot_keep
        self.run_record = run_record  # run.json: how far this run got, for `vram-bench runs`
        self.time_limit = time_limit  # a job's wall-clock limit: the final snapshot is written before it
        self.requeue = requeue  # requeue the batch job after a requeue signal's or the time limit's snapshot
        self.on_memory_limit = on_memory_limit  # what the memory guard's "the ceiling is near" does (memory_guard.py)
        self._snapshot_seconds: float | None = None  # how long the last snapshot took (the time limit plans with it)
        self._state_bytes_estimate: int | None = None  # until a snapshot is timed, its size says how long one takes
        self.freeze_gc = freeze_gc  # freeze what setup() left alive: short full collections (memory/gc_freeze.py)
        self.frozen: Frozen | None = None
        self.nice_increment = nice
        self.nice: int | None = None  # the training thread's nice value once lowered
        self.last_snapshot_step: int | None = None
        self.last_snapshot_path: str | None = None  # the last snapshot this run wrote (or resumed from)
        self.last_snapshot_error: str | None = None  # why the last attempt failed, if it did
        self.final_snapshot: FinalSnapshot | None = None  # what the quit's final snapshot did: said after exit
        self._first_step = 0  # the step setup() or the resume started from: no snapshot before a step has run
        self.activity: str | None = None  # a long action running between steps, for the status bar
        self._interrupt_lock = threading.Lock()
        self._interrupt_pending = False  # sent to the running step and not seen raised yet (under the lock)
        self.exit_on_error_pause = False  # headless with stdin closed: nobody could resume
        self.last_profile: Profile | None = None
        self.step_started: float | None = None  # monotonic time the running step began (None between steps)
        self.evaluate_started: float | None = None  # monotonic time the user's running evaluate() began
        # Under torchrun, an agreed evaluation (evaluate() and the ranks' check of its collectives): when it began.
        self.evaluation_since: float | None = None
        self.step_ms_history: deque[float] = deque(maxlen=50)
        self._recording = False
        self.eval_watch = EvalModeWatch()  # warns when steps run with the trained model in eval mode
        self.schedules_as_made: AsMade = {}  # the LR schedulers as the last setup() made them (scheduler_carry.py)
        self.optimizers_as_made: Settings = {}  # their hyperparameters as it made them, kept in snapshots

        self.state = RunState.SETUP
        self.pause_reason: str | None = None
        self.step = 0
        self.user_state: Any = None
        self.random_before_setup: dict[str, Any] | None = None  # the global random states the first setup() began with
        self.setup_started = time.monotonic()
        self.setup_seconds: float | None = None
        self.setup_error: str | None = None
        self.setup_error_location: str | None = None
        self.setup_traceback: str | None = None
        self.setup_suspects: list[str] = []  # parameters setup() left holding garbage (uninitialized.py)
        self._first_step_after_setup = 0
        self.exit_code = 0
        self.exit_reason = "quit"
        self._quit = False
        self._step_once = False
        self._last_step_version = 0  # the code version that ran the last step: a DDP error names the code it blames
        self.resumes = 0  # pauses ended so far (lockstep.py: a rank's failure reported after one ended is stale)
        # Commands that came after a `step` in one batch: each `step` runs before the next command is taken, so
        # `step`, `step`, `quit` sent at once are two steps and then the quit (under torchrun: on every rank alike).
        self._after_step: deque[Command] = deque()
        self._profile: ProfileRun | None = None
        self._module_count = len(sys.modules)
        device = bench.device
        self._gpu_index = (device.index or 0) if device.type == "cuda" and probe.available() else None
        self._held: dict[Path, ChangeSet] = {}
        # After a resume: optimizer states the snapshot has and setup() made no optimizer for (step() makes them).
        self._pending_optimizers: PendingOptimizers | None = None
        self._epoch_check: EpochCheck | None = None  # after the first resumed step: the loaders' sampler epochs
        self._time_limit_said = False  # under torchrun: rank 0 has asked every rank to quit for the time limit
        self._state_built_at = 0  # the code version live when setup() last built the state (start, or a rebuild)
        self._statements: dict[Path, list[tuple[str, RunInNamespace]]] = {}
        # (module, global) made at import holding a DataLoader whose workers run code a save changed since: R runs the
        # statement that made it again (workbench/engine/hotswap/loader_workers.py).
        self.loaders_to_rebuild: set[tuple[str, str]] = set()
        # code version -> the loader iterators running when that save was applied (weakly), and the globals it added
        # above: its rollback says nothing of those (they have the code that is live again) and takes those back.
        self.workers_at_version: dict[int, tuple[Any, set[tuple[str, str]]]] = {}
        self.lockstep: Lockstep | None = None  # under torchrun: every rank runs the same commands at the same boundary
        self.last_loss: float | None = None
        self.last_step_time: float | None = None  # when the last step ended (Unix seconds)
        self._unread: StepRecord | None = None  # the last step, its loss still on its way from the GPU (step_values.py)
        self._values_read_at = 0.0  # perf_counter when the last step's values were read
        self._failure = StepFailure("")  # the last failed step: what every rank is told under torchrun
        # The project generators the last failed step's error went up through, which it ended (generator_end.py):
        # (their names, that step, its exception's type), until a step succeeds.
        self._ended_generators: tuple[list[str], int, str] | None = None
        self._pause_announced = False  # under torchrun: this rank's non-finite loss is on its way to every rank
        # Under torchrun: this rank has run the last step of --max-steps and holds for the boundary after it, where
        # every rank does what that step is due for and ends (planned_turns.py).
        self.held_for_planned_end = False
        self.setup_rebinds = SetupRebinds()  # globals setup() re-bound: a rebuild's setup() reads what it found
        self.training_globals = TrainingGlobals()  # counters step() keeps in globals: snapshots hold them
        self.training_tensors = TrainingTensors()  # an LSTM's hidden state carried across batches: snapshots hold it
        self.broken: Broken | None = None  # the state must be rebuilt (under torchrun maybe on new groups) to go on
        self._lost = False  # under torchrun: another rank is gone, so no collective can complete
        self._left_alone = False  # under torchrun: this rank left the loop on an internal error, out of step

    def held_paths(self) -> list[Path]:
        """Files with saved changes held back until a rebuild (read from other threads: a copy)."""
        return list(self._held)

    @property
    def profiling(self) -> bool:
        return self._profile is not None

    # Thread body -------------------------------------------------------------------------
    def run(self) -> None:
        if self.router is not None:
            self.router.capture_thread()
        self.nice = lower_current_thread(self.nice_increment)  # before setup(): the threads it starts inherit it
        try:
            use_on_this_thread(self.bench.device)  # CUDA's current device is per thread (thread_device.py)
            self._start_memory_recording()
            self._run_setup()
            if self.lockstep is not None:
                self._agree_on_setup()
            while not self._quit:
                idle = self.state is not RunState.RUNNING and not self._step_once
                if idle:
                    self._settle_values()  # nothing is queued behind the last step: its loss before waiting
                self._handle_commands(block=idle)
                if self._quit:
                    break
                try:
                    if self.state is RunState.RUNNING or (self._step_once and self.state is RunState.PAUSED):
                        self._step_once = False
                        self._run_step()
                        self._check_max_steps()
                    if self.time_limit is not None and not self._quit:
                        self._check_time_limit()
                except KeyboardInterrupt:
                    # An interrupt that arrived just after its step finished: nothing to stop.
                    self._command_error("the step had already finished when the interrupt arrived")
        except RanksLost as exc:
            self._ranks_lost(exc)
        except BaseException as exc:  # noqa: BLE001 - a bug in the workbench: say so, exit non-zero
            self.exit_code, self.exit_reason = 1, "internal error"
            # Under torchrun the other ranks are not at this turn: the last exchange would pair with one of theirs
            # and wait forever. This rank just ends; torchrun stops the others, which end as for a rank that died.
            self._left_alone = True
            self.bus.publish(
                Error(where="worker", message=f"vram-bench internal error: {exc!r}",
                      traceback=format_traceback(traceback.TracebackException.from_exception(exc)))
            )
        finally:
            self._settle_values_at_exit()
            if self.lockstep is not None and not self._lost and not self._left_alone:
                self._finish_lockstep()
            if self._profile is not None:
                self._profile.abort()
                self._profile = None
            if self.frozen is not None:
                release_frozen()
            self.state = RunState.STOPPED
            self._update_run_record(ended=time.time(), exit_reason=self.exit_reason)
            self.bus.publish(Exit(reason=self.exit_reason, step=self.step, code=self.exit_code))
            if self.router is not None:
                self.router.release_thread()

    def _handle_commands(self, block: bool) -> None:
        if self.lockstep is not None:
            self.lockstep.boundary(self, block)  # the same batch on every rank (workbench/engine/lockstep.py)
            return
        if not block and self.commands.empty():
            return  # the common case between two steps: no queue.Empty raised and caught
        try:
            command = self.commands.get(timeout=0.5) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            dispatch(self, command)  # the one place a command runs: see workbench/engine/dispatch.py
            if self._quit or type(command) is StepOnce:
                return  # after a `step`, the rest stays queued until the step has run
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return

    def run_in_order(self, commands: list[Command], release: bool = False) -> None:
        """Under torchrun, an exchange's commands, which every rank received alike: the ranks' failures first, then
        what a planned turn is due for (--eval-every, --snapshot-every, --max-steps: as one process does right after
        its step), then the rest
        in order, each `step` run before the commands after it, which wait for an exchange posted after that
        step ran (`release`): it holds any failure of the step, which runs before them. While a step is owed or
        commands wait, the new ones wait behind them. The split is by the commands' kinds and the exchanges alone,
        never by a rank's own state, so every rank splits the same way."""
        self._after_step.extend(commands)
        if self._step_once or (len(self._after_step) > len(commands) and not release):
            return
        waiting = list(self._after_step)
        self._after_step = deque(sorted(waiting, key=lambda command: RUN_FIRST.get(type(command).__name__, len(RUN_FIRST))))
        self._run_held_back()

    def _run_held_back(self) -> None:
        """The commands in order, up to and with the next `step`; nothing after a quit."""
        while self._after_step:
            command = self._after_step.popleft()
            dispatch(self, command)
            if self._quit:
                self._after_step.clear()
                return
            if type(command) is StepOnce:
                return

    # Setup -------------------------------------------------------------------------------
    def _run_setup(self) -> None:
        self.state = RunState.SETUP
        self.setup_started = time.monotonic()
        self.setup_error = self.setup_error_location = None
        self.bus.publish(Setup(status="running"))
        setup = self.project.function("setup")
        namespaces = self._namespaces()
        found = copies(namespaces)
        try:
            if setup is None:
                raise NameError("setup(bench) is not defined in the project file")
            if self.random_before_setup is None:  # not after a failed setup() drew from them: a fresh start's
                self.random_before_setup = random_states.held(random_states.capture())  # a rebuild's setup() draws from them again
            # Resuming: the snapshot fills the parameters, so their initialization is recorded, not run.
            with skipping_init(active=self.resume_path is not None) as init_log:
                self.user_state = setup(self.bench)
            self._state_built_at = self.reloader.version
            self.schedules_as_made = as_made(self.user_state, self._namespaces())  # what a rebuild compares with
            self.optimizers_as_made = settings_of(find_with_globals(self.user_state, self._namespaces())[1])
            self.setup_rebinds.record(found, self._namespaces())
            self.training_globals.mark(self._plain_value_namespaces())
            self.training_tensors.mark(self._training_namespaces())
        except Exception as exc:  # noqa: BLE001 - the user's setup failing is expected, and reported
            seconds = time.monotonic() - self.setup_started
            file, line = self._where(exc)
            self.setup_error = f"setup() raised {type(exc).__name__}: {exc}{setup_error_hint(exc)}"
            self.setup_error_location = f"{file}:{line}" if file else None
            self.setup_traceback = self._format(exc)
            self.bus.publish(Setup(status="failed", seconds=seconds))
            self.bus.publish(
                Error(where="setup", message=self.setup_error, file=file, line=line, traceback=self.setup_traceback)
            )
            traceback.clear_frames(exc.__traceback__)
            # What the failed setup() bound goes: the fixed one, run again, finds the globals as a fresh start would.
            restore_globals(namespaces, found)
            self.state = RunState.SETUP_FAILED
            if self.exit_on_setup_failure:
                self.exit_code, self.exit_reason, self._quit = 2, "setup failed", True
            return
        self.setup_seconds = time.monotonic() - self.setup_started
        self._state_bytes_estimate = None
        self._state_bytes()  # once, here: the memory guard and the time limit plan a snapshot's time with it
        self.eval_watch.refresh(self.user_state)
        self.bus.publish(Setup(status="done", seconds=self.setup_seconds))
        if self.resume_path is None:  # a resume's values come from the snapshot, read lazily: not read here
            self._warn_of_uninitialized_parameters()
        self.reloader.track_loaded_modules()  # modules that setup imported are watched too
        resumed = True
        if self.resume_path is not None:
            path, self.resume_path = self.resume_path, None  # once: a later rebuild starts from the live state
            resumed = self._resume_from(path, init_log)
        if self.freeze_gc:
            self.frozen = freeze_survivors()
        if not resumed:
            return
        if self.start_paused:
            self._pause("user")
        else:
            self.state = RunState.RUNNING

    def _warn_of_uninitialized_parameters(self) -> None:
        """Before the first step blames itself for a NaN loss: parameters setup() left holding garbage."""
        self._first_step_after_setup = self.step + 1
        try:
            self.setup_suspects = suspect_parameters(self.user_state, self._namespaces())
        except Exception:  # noqa: BLE001 - a diagnosis: it must not become a failure of its own
            self.setup_suspects = []
        if self.setup_suspects:
            self.bus.publish(Error(where=UNINITIALIZED, message=warning_sentence(self.setup_suspects)))

    def _resume_from(self, path: Path, init_log: InitLog) -> bool:
        """Load a snapshot into what setup() built; on a mismatch load nothing and say what differs.

        `init_log`: the initializations setup() skipped; what the snapshot does not fill is initialized
        now, and when nothing is loaded, everything is, so training starts from what setup() builds."""
        started = time.monotonic()
        if path.is_dir():
            return self._resume_sharded(path, init_log, started)
        try:
            if has_fsdp1(find_with_globals(self.user_state, self._namespaces())[0].values()):
                raise UserError(f"{path} is a one-file snapshot: a model wrapped in FSDP1's FullyShardedDataParallel "
                                "loads sharded snapshots only (step-N.dcp, which vram-bench writes for it)")
            payload = load_snapshot(path)
            report = apply_snapshot(
                self.user_state, payload, path, partial=self.resume_partial, namespaces=self._namespaces(),
                init_log=init_log,
            )
        except Exception as exc:  # noqa: BLE001 - a snapshot that does not fit must not cost the session
            init_log.replay_all()
            self._resume_failed(_failed_resume(exc, path, ends=self.exit_on_setup_failure))
            return False
        self.step = self.last_snapshot_step = self._first_step = report.step
        self.last_snapshot_path = str(path)
        notes: tuple[str, ...] = ()
        if report.pending_optimizers:
            self._pending_optimizers = PendingOptimizers.after_resume(path, report.pending_optimizers, self.step)
            notes = self._pending_optimizers.notes_at_resume
        notes += _initialized_note(report.initialized)
        notes += tuple(settled_notes(init_log, "resume"))
        notes += tuple(report.moved)
        notes += tuple(report.scheduler_notes)
        notes += tuple(report.settings_notes)
        notes += self._put_back_globals(payload.get("globals", {}), payload.get("loader_places"))
        notes += code_notes(payload.get(CODE_KEY), self.project.root)
        self.bus.publish(
            ResumeLoaded(
                ok=True,
                path=str(path),
                step=report.step,
                tensors=report.tensors,
                optimizers=report.optimizers,
                seconds=time.monotonic() - started,
                missing=tuple(report.missing),
                unexpected=tuple(report.unexpected),
                mismatched=tuple(report.mismatched),
                notes=notes,
                initialized=tuple(report.initialized),
                mapped=report.mapped,
                schedulers=report.schedulers,
            )
        )
        return True

    def _put_back_globals(self, saved: dict[str, Any], saved_places: dict[str, Any] | None) -> tuple[str, ...]:
        """The counters step() kept in module globals, as the snapshot has them (training_globals.py), the places of
        the stateful data loaders (loader_places.py), and what the iterators setup() made start from
        (fresh_iterators.py): the resume's notes."""
        try:
            done, left = put_back(saved, self._plain_value_namespaces())
        except Exception as exc:  # noqa: BLE001 - the model is loaded: the counters starting over is said, not fatal
            done, left = [], [f"the snapshot's plain values ({type(exc).__name__}: {exc})"]
        in_state = [entry for entry in done if entry.startswith("state[")]
        done = [entry for entry in done if not entry.startswith("state[")]
        notes = (f"put back from the snapshot (module globals that training changed, not setup()): {', '.join(done)}",) if done else ()
        if in_state:
            notes += (f"put back from the snapshot (plain values of setup()'s state that training changed): "
                      f"{', '.join(in_state)}",)
        notes += ((f"not put back: {', '.join(left)}",) if left else ())
        rank, world_size = (self.lockstep.rank, self.lockstep.world_size) if self.lockstep is not None else (0, 1)
        try:
            loaders = put_back_places(find_loaders(self.user_state, self._namespaces()), saved_places, rank, world_size,
                                      self.step)
        except Exception as exc:  # noqa: BLE001 - the data starting over must not cost the resume
            loaders = PutBack(notes=[f"the data loaders' places were not put back ({type(exc).__name__}: {exc})"])
        self._epoch_check = loaders.epoch_check
        notes += self._put_back_tensors(saved_places, rank, world_size)
        said = random_states.put_back_ranks(saved_places, rank, world_size, self.step) if self.lockstep is not None else None
        names = [entry.split(" = ", 1)[0] for entry in done]
        return (notes + tuple(loaders.notes)
                + fresh_iterator_notes(self.user_state, self.step, names, self._project_relative, loaders.placed,
                                       reshuffled=loaders.reshuffled, namespaces=self._namespaces())
                + ((said,) if said else ()))

    def _put_back_tensors(self, saved_places: dict[str, Any] | None, rank: int, world_size: int) -> tuple[str, ...]:
        """This rank's tensors that training had changed (training_tensors.py): the resume's notes."""
        ranks = (saved_places or {}).get("ranks") or {}
        if (saved_places or {}).get("world_size") != world_size:
            theirs = sorted({shown(q) for record in ranks.values() for q in (record.get("tensors") or {})})
            return (f"not put back: {', '.join(theirs)} (each rank's own tensors, and the snapshot is of "
                    f"{saved_places.get('world_size')} ranks, this run has {world_size})",) if theirs and saved_places else ()
        if rank not in ranks and (ranks.get(0) or {}).get("tensors"):
            return ("not put back: this rank's tensors that training changed (the snapshot keeps rank 0's record "
                    "only: rank 0 took it alone)",)
        try:
            done, left = put_back_tensors((ranks.get(rank) or {}).get("tensors") or {}, self._training_namespaces())
        except Exception as exc:  # noqa: BLE001 - the model is loaded: these starting over is said, not fatal
            done, left = [], [f"the tensors training had changed ({type(exc).__name__}: {exc})"]
        notes = (f"put back from the snapshot (tensors training changed): {', '.join(done)}",) if done else ()
        return notes + ((f"not put back: {', '.join(left)}",) if left else ())

    def _resume_failed(self, event: ResumeLoaded) -> None:
        """Nothing was loaded: said; headless ends (exit 2), the app pauses on what setup() built."""
        self.bus.publish(event)
        self.bus.publish(Error(where="resume", message=event.error or ""))
        if self.exit_on_setup_failure:
            self.exit_code, self.exit_reason, self._quit = 2, "resume failed", True
        else:
            self.state = RunState.RUNNING
            self._pause("resume failed")

    def _resume_sharded(self, path: Path, init_log: InitLog, started: float) -> bool:
        """Every rank reads its part of a sharded snapshot (torch.distributed.checkpoint reshards to this world size)."""
        init_log.replay_all()  # DCP writes into the live shards: they must exist first
        try:
            report, saved_globals = load_sharded(self.user_state, path, self._namespaces(), partial=self.resume_partial)
        except Exception as exc:  # noqa: BLE001 - said like any resume that does not fit; setup()'s state trains
            self._resume_failed(_failed_resume(exc, path, ends=self.exit_on_setup_failure))
            return False
        self.step = self.last_snapshot_step = self._first_step = report.step
        self.last_snapshot_path = str(path)
        try:
            rank, world_size = (self.lockstep.rank, self.lockstep.world_size) if self.lockstep is not None else (0, 1)
            saved_places = read_loader_places(path, rank, world_size, find_loaders(self.user_state, self._namespaces()))
        except Exception as exc:  # noqa: BLE001 - the model is loaded: the data starting over is said, not fatal
            saved_places = {"error": f"{type(exc).__name__}: {exc}"}
        self.bus.publish(ResumeLoaded(ok=True, path=str(path), step=report.step, tensors=report.tensors,
                                      optimizers=report.optimizers, schedulers=report.schedulers,
                                      seconds=time.monotonic() - started,
                                      missing=tuple(report.missing), unexpected=tuple(report.unexpected),
                                      mismatched=tuple(report.mismatched), initialized=tuple(report.initialized),
                                      notes=("sharded snapshot (torch.distributed.checkpoint): every rank read its part",
                                             *_initialized_note(report.initialized),
                                             *settled_notes(init_log, "resume"), *report.moved,
                                             *report.scheduler_notes, *report.settings_notes,
                                             *self._put_back_globals(saved_globals, saved_places),
                                             *code_notes(self._sharded_code(path), self.project.root))))
        return True

    @staticmethod
    def _sharded_code(path: Path) -> Any:
        """The code record in a sharded snapshot's facts; None when they cannot be read (the load read them already)."""
        try:
            return read_facts(path).get(CODE_KEY)
        except UserError:
            return None

    def _namespaces(self) -> list[tuple[str, dict[str, Any]]]:
        """The project's module globals: where script-style trainers keep an optimizer (`global OPT_G`)."""
        return [(m.__name__, vars(m)) for m in self.project.modules().values()]

    def _training_namespaces(self) -> list[tuple[str, dict[str, Any]]]:
        """Where training tensors live (training_tensors.py): the module globals, and setup()'s state dict."""
        return self._namespaces() + state_namespace(self.user_state)

    def _plain_value_namespaces(self) -> list[tuple[str, dict[str, Any]]]:
        """Where plain training values live (training_globals.py): the module globals, setup()'s state dict, and the
        project's own objects at its top (`state['trainer'].iter_num`)."""
        namespaces = self._namespaces()
        return namespaces + state_namespace(self.user_state, frozenset(name for name, _ in namespaces))

    def _load_pending_optimizers(self) -> None:
        """After a step: load snapshot state into optimizers step() has made since the resume."""
        assert self._pending_optimizers is not None
        event = self._pending_optimizers.after_step(self.user_state, self._namespaces(), self.step)
        if self._pending_optimizers.done:
            self._pending_optimizers = None
        if event is not None:
            self.bus.publish(event)

    # One training step ---------------------------------------------------------------------
    def _run_step(self) -> None:
        step_fn = self.project.function("step")
        self.bench.step = self.step
        gpu = self._gpu_index
        if gpu is not None:
            self.probe.reset_peaks()  # so the peak read after the step is this step's
        started_in_eval = self.eval_watch.starting()
        started = time.perf_counter()
        with self._interrupt_lock:
            self.step_started = time.monotonic()
        saved_bytes: int | None = None
        try:
            try:
                if step_fn is None:
                    raise NameError("step(state, bench) is not defined in the project file")
                if self.telemetry.versions.wants_saved_measurement():
                    with SavedBytes(self.user_state) as saved:
                        out = step_fn(self.user_state, self.bench)
                    self.telemetry.versions.record_saved(saved.bytes)
                    saved_bytes = saved.bytes
                else:
                    out = step_fn(self.user_state, self.bench)
                values = start_reading(out, self.bench._take_logged())
            except KeyboardInterrupt:
                self._interrupt_raised()
                raise
            finally:
                self._user_call_ends()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - a failing step pauses; the model survives
            self.bench._take_logged()
            self._step_failed(exc)
            return
        ms = (time.perf_counter() - started) * 1000
        if gpu is not None:
            peak = self.probe.peak_allocated(gpu)
            if peak is not None:
                self.telemetry.step_peaks[gpu] = peak
        self._track_new_modules()
        self.step += 1
        self._ended_generators = None
        self.last_step_time = time.time()
        peak = self.telemetry.step_peaks.get(gpu) if gpu is not None else None
        later = values.reader is not None and not values.ready
        record = StepRecord(self.step, values, started, ms, later, self.reloader.version, self.last_step_time,
                            saved_bytes, gpu if peak is not None else None, peak)
        self._last_step_version = record.version
        earlier, self._unread = self._unread, None
        if later:  # its loss is read at the next step's end, once that step is queued, or when something needs it
            self._unread = record
        checks: list[tuple[float, int]] = []  # checked last: a pause for a NaN then comes after both steps' events
        if earlier is not None and (loss := self._record_values(earlier)) is not None:
            checks.append((loss, earlier.step))
        if not later:
            if (loss := self._record_values(record)) is None:
                return
            checks.append((loss, record.step))
        if self._pending_optimizers is not None:
            self._load_pending_optimizers()
        if self._epoch_check is not None:
            check, self._epoch_check = self._epoch_check, None
            if (sentence := check.after_step()) is not None:
                self.bus.publish(Error(where=LOADER, message=sentence))
        if (warning := self.eval_watch.after_step(started_in_eval, self.step)) is not None:
            self.bus.publish(warning)
        if (self.eval_every or self.snapshot_every) and (self.lockstep is None or self.lockstep.world_size == 1):
            self._due_after_step()  # under torchrun, every rank at the boundary after this step (planned_turns.py)
        if self._profile is not None and self._profile.step_done():
            profile, self._profile = self._profile, None

            def finish() -> Profile:
                self.last_profile = profile.finish()
                return self.last_profile

            self._settle_values()
            self._publish_or_report("profile", finish)
        for loss, step in checks:
            if not self._check_finite(loss, step):
                break

    def _record_values(self, record: StepRecord) -> float | None:
        """A step's loss and scalars into the charts, the versions table, the ranks' rows and a `step` event; the
        loss, for `_check_finite`. None: reading it from the GPU raised (an error of the step's own kernels, which
        CUDA reports late), reported as the step's failure."""
        try:
            loss, scalars = record.values.read()
        except Exception as exc:  # noqa: BLE001 - as if the step had raised it: paused, the model kept
            self._step_failed(exc, read_of=record.step)
            return None
        if record.late:  # the step returned before the GPU ran it: its time is the GPU's pace, value to value
            read_at = time.perf_counter()
            record.ms = (read_at - max(self._values_read_at, record.started)) * 1000
        else:
            read_at = record.started + record.ms / 1000
        self._values_read_at = read_at
        self.step_ms_history.append(record.ms)
        self.last_loss = loss
        if self.lockstep is not None:
            self.lockstep.record_step(record.step, loss, record.ms, record.version, record.ended)
        self.telemetry.record_step(record.step, {"loss": loss, **scalars}, record.ms)
        self.telemetry.versions.record_step(record.ms, loss, scalars, record.peak)
        self.bus.publish(Step.quick(record.step, loss, record.ms, scalars, record.version, gpu=record.gpu,
                                    peak_allocated=record.peak, saved_bytes=record.saved_bytes,
                                    rank=self.lockstep.rank if self.lockstep is not None else None, time=record.ended))
        return loss

    def _settle_values(self) -> None:
        """The last step's loss, waiting for the GPU if it must: before anything that reads it or reports after it
        (a command, a pause, an evaluation, a profile, the exit), so every `step` event comes in order and none is lost."""
        record, self._unread = self._unread, None
        if record is not None and (loss := self._record_values(record)) is not None:
            self._check_finite(loss, record.step)

    def _settle_values_at_exit(self) -> None:
        """The last step's loss as the run ends; a GPU that cannot give it (a broken context) loses that step's event
        only, never the exit."""
        try:
            self._settle_values()
        except Exception as exc:  # noqa: BLE001 - the exit and the final snapshot must still happen
            self.bus.publish(Error(where="step", message=f"the loss of step {self.step} could not be read: {exc}"))

    def _check_finite(self, loss: float, step: int) -> bool:
        """A non-finite loss pauses (every rank under torchrun), naming the parameters that went bad; False then."""
        if math.isfinite(loss):
            return True
        if not self._pause_announced:
            try:
                culprits = describe_non_finite(self.user_state)
            except Exception as exc:  # noqa: BLE001 - the diagnosis must not turn into a second failure
                culprits = f"could not inspect the parameters ({exc})"
            if self.setup_suspects and step == self._first_step_after_setup:
                culprits += (f"; setup() had left garbage in {len(self.setup_suspects)} of them before this step "
                             "(the `parameters` warning)")
            late = f", read after step {self.step} was queued" if step != self.step else ""
            message = (f"loss is {loss} at step {step} (the first non-finite step{late}); {culprits}. "
                       "Training paused: fix the code and save, or resume to continue anyway.")
            self._failure = StepFailure(message)
            self.bus.publish(Error(where="step", message=message))
            if self.lockstep is not None and self.lockstep.world_size > 1:
                # Every rank pauses at the boundary the ranks agree on, this one included: the step itself finished, so
                # this rank trains on until then. Pausing alone would leave DDP peers inside the next step's
                # collective, waiting for it until the collective timeout.
                self._pause_announced = True
                self.lockstep.announce_pause(self, "non-finite loss", self._failure)
            else:
                self._pause("non-finite loss")
        return False

    def _track_new_modules(self) -> None:
        """A module the step imported lazily is tracked for reloads (an O(1) check per step)."""
        if len(sys.modules) != self._module_count:
            self._module_count = len(sys.modules)
            self.reloader.track_loaded_modules()

    def _step_failed(self, exc: BaseException, read_of: int | None = None) -> None:
        """Pause for a step that raised; `read_of`: the step whose values raised as they were read from the device (the
        step itself had returned: CUDA reports an error of a step's kernels at the next sync)."""
        self._settle_values()  # the step before this one, reported before its failure
        file, line = self._where(exc)
        message = f"step() raised {type(exc).__name__}: {exc}"
        if read_of is not None:
            message = (f"reading step {read_of}'s loss from the device raised {type(exc).__name__}: {exc} (an error in "
                       "the work queued on the device so far: a device reports a kernel's error only when something "
                       "waits for it, here the loss read a step late)")
        if isinstance(exc, StepOutputError):
            message = str(exc)
        elif isinstance(exc, KeyboardInterrupt):
            message = "step() was interrupted" + (f" at {file}:{line}" if file else "") + "; the model and optimizer are intact"
        elif is_out_of_memory(exc):
            message = f"out of memory in step(): {exc}. The step's tensors were released and the cache emptied; {self._memory_report()}"
        elif isinstance(exc, StopIteration):
            ended_by = ended_by_error(*self._ended_generators) if self._ended_generators is not None else None
            message = data_ran_out_message(self.step, file, line, str(self.project.root / file) if file else None,
                                           ended_by)
        elif self.stopping_on_signal and raised_in_data_loader(exc):
            message = (f"step {self.step + 1} was cut short while stopping: its DataLoader's worker processes died (a "
                       "launcher such as torchrun signals every process of a rank's group; workers this process did not "
                       f"fork, as with `spawn`, do not wait for it); the model and optimizer hold step {self.step}, the "
                       "last whole one "
                       f"({type(exc).__name__}: {exc})")
        ended = [] if isinstance(exc, StopIteration) else generators_ended(exc, self._project_relative)
        in_state = ended_in_state(exc, self.user_state) if ended else []
        if ended:
            message += ended_sentence(ended, bool(in_state))
            self._ended_generators = (ended, self.step + 1, type(exc).__name__)
        broken: str | None = None
        if in_state:
            broken = (f"step {self.step + 1}'s {type(exc).__name__} ended {' and '.join(in_state)}, which step() reads "
                      "(reading it again could only raise StopIteration)")
        renew = False
        if self.lockstep is not None:
            if is_dead_group_error(exc):
                renew = True
                broken = "a training collective failed, so the training process group is dead"
                message += (f" (rank {self.lockstep.rank} waited in a training collective for a rank that did not join it, "
                            "up to --collective-timeout; resuming makes the groups again and rebuilds the state on every rank)")
            elif is_unused_parameter_error(str(exc)):
                broken = "DistributedDataParallel's reducer refuses every step after unused parameters"
                since = self._last_step_version
                changed = (self.step, since, self.reloader.version) if since != self.reloader.version else None
                message = unused_parameter_sentence(str(exc), self.user_state, self._namespaces(), changed)
        self._failure = StepFailure(message, self._format(exc), file, line, self.step, broken, renew)
        if broken is not None:
            self.broken = Broken(broken, renew or (self.broken is not None and self.broken.renew_group))
        where = "data" if isinstance(exc, StopIteration) else "step"  # the data's end: no fix to save (data_end.py)
        self.bus.publish(Error(where=where, message=message, file=file, line=line, traceback=self._failure.traceback))
        traceback.clear_frames(exc.__traceback__)  # the frames pin the step's tensors
        if is_out_of_memory(exc):
            if self._recording:
                self._publish_or_report("memory snapshot", lambda: self._dump_memory("oom"))
            del exc
            collect_all()
            self.probe.empty_cache()
            self._pause("out of memory")
            return
        if isinstance(exc, StopIteration):
            self._pause(DATA_EXHAUSTED)
            return
        self._pause("interrupted" if isinstance(exc, KeyboardInterrupt) else "error")

    def _memory_report(self) -> str:
        from workbench.engine.memory.host import read_host_memory
        from workbench.units import human_bytes

        parts = [f"process RSS {human_bytes(read_host_memory().rss)}"]
        for gpu in self.probe.gpus():
            parts.append(
                f"cuda:{gpu.index} allocated {human_bytes(gpu.allocated)}, reserved {human_bytes(gpu.reserved)}, "
                f"device {human_bytes(gpu.device_used)} of {human_bytes(gpu.device_total)}"
            )
        return "; ".join(parts) + ". Lower the batch size (or use the memory lab's techniques) and save to resume."

    def interrupt(self) -> bool:
        """From another thread: raise KeyboardInterrupt in the running step or evaluate() (at its next Python
        bytecode).

        Under a lock with the call's start and end, so it can only land inside one; one still
        pending when the call ends is cancelled there.
        """
        with self._interrupt_lock:
            if (self.step_started is None and self.evaluate_started is None) or self.ident is None:
                return False
            _set_async_exc(self.ident, KeyboardInterrupt)
            self._interrupt_pending = True
            return True

    def _interrupt_raised(self) -> None:
        """The step raised KeyboardInterrupt: nothing is left to cancel."""
        with self._interrupt_lock:
            self._interrupt_pending = False

    def _user_call_ends(self) -> None:
        """The user's step or evaluate() returned or raised."""
        with self._interrupt_lock:
            self.step_started = self.evaluate_started = None
            if self._interrupt_pending:  # sent too late to land in the step: cancel it (never when none was sent)
                self._interrupt_pending = False
                if sys.getprofile() is None and sys.gettrace() is None:
                    _set_async_exc(threading.get_ident(), None)
                # else: a profiler runs in this thread and cancelling would hang it (see _set_async_exc); the
                # interrupt lands in the bookkeeping after the step, which pauses as for an interrupted step.

    def _check_max_steps(self) -> None:
        if self.max_steps is None or self.step < self.max_steps:
            return
        self._settle_values()
        if self.exit_at_max_steps and self.lockstep is not None and self.lockstep.ends_at_next_boundary():
            # Under torchrun every rank ends at the boundary after this last step, planned from an exchange
            # (planned_turns.py): each stops stepping (no event: nobody paused anything) and holds for it.
            self.state, self.pause_reason, self.held_for_planned_end = RunState.PAUSED, "max steps", True
        elif self.exit_at_max_steps:
            self.end_at_max_steps(together=False)
        elif self.state is RunState.RUNNING:
            self._pause("max steps")

    def _due_after_step(self) -> None:
        """One process: --eval-every's evaluation and --snapshot-every's snapshot, when this step is due for them."""
        if self.eval_every and self.step % self.eval_every == 0 and self.project.function("evaluate"):
            self._run_evaluate()
        if self.snapshot_every and self.step % self.snapshot_every == 0:
            self.periodic_snapshot()

    def periodic_snapshot(self, together: bool = False) -> None:
        """--snapshot-every's, after its step's event (on a GPU the loss is read a step late: settled first)."""
        self._settle_values()
        self._snapshot("periodic", together)

    def end_at_max_steps(self, together: bool) -> None:
        """Headless, --max-steps reached: a final snapshot of the trained state (a run that ends with its data writes
        one; one that ended at --max-steps wrote none, and the trained model went with the process), then exit.
        `together`: every rank is here at one boundary (planned_turns.py), so a snapshot can gather them all."""
        self.held_for_planned_end = False
        self._final_snapshot(together=together)
        if self.exit_reason != "final snapshot failed":
            self.exit_reason = "max steps"
        self._quit = True

    # Between steps: what the loop and the command handlers (workbench/engine/commands/) share ----
    def _run_evaluate(self, agreed: bool = False) -> None:
        """Run the user's evaluate(). `agreed`: every rank runs it now, at a boundary the ranks agreed on (the
        `evaluate` command, or under torchrun the turn `--eval-every` planned: planned_turns.py), so they can then
        check that each ran the same collectives in it (collective_count.py)."""
        self._settle_values()
        ranks = agreed and self.lockstep is not None and self.lockstep.world_size > 1
        if not ranks:
            self._evaluate_once()
            return
        self.evaluation_since = time.monotonic()  # where this rank is, for the `waiting` report (whereabouts.py)
        try:
            before = training_operations()
            self._evaluate_once()
            self._check_evaluate_collectives(before)
        finally:
            self.evaluation_since = None

    def _check_evaluate_collectives(self, before: int | None) -> None:
        """Every rank, after evaluate(): the same number of training-group operations, or every rank pauses."""
        assert self.lockstep is not None
        after = training_operations()
        issued = self.lockstep.plane.gather_json(None if before is None or after is None else after - before)
        sentence = mismatch_sentence(issued, "evaluate()")
        if sentence is None:
            return
        self.broken = Broken("evaluate() ran a different number of collectives on each rank", renew_group=True)
        if self.lockstep.rank == 0:
            self.bus.publish(Error(where="evaluate", message=sentence))
        self._pause("error", announce=False)  # every rank saw the same counts: each pauses here, at the same boundary

    def _evaluate_once(self) -> None:
        """Run the user's evaluate(); its scalars join the chart. A failure is reported, training goes on."""
        evaluate = self.project.function("evaluate")
        started = time.perf_counter()
        with self._interrupt_lock:
            self.evaluate_started = time.monotonic()
        try:
            try:
                out = evaluate(self.user_state, self.bench)  # type: ignore[misc]
                if not isinstance(out, dict):
                    raise StepOutputError(f"evaluate() returned {type(out).__name__}; return a dict of scalars")
                scalars = {str(k): scalar_now(v, str(k), "evaluate() returned ") for k, v in out.items()}
            except KeyboardInterrupt:
                self._interrupt_raised()
                raise
            finally:
                self._user_call_ends()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - a failing evaluate() is reported; training goes on
            file, line = self._where(exc)
            said = ("evaluate() was interrupted (i); training goes on" if isinstance(exc, KeyboardInterrupt)
                    else f"evaluate() raised {type(exc).__name__}: {exc}")
            self.bus.publish(Error(where="evaluate", message=said, file=file, line=line, traceback=self._format(exc)))
            traceback.clear_frames(exc.__traceback__)
            return
        self.telemetry.record_step(self.step, scalars, 0.0, count=False)
        self.telemetry.versions.record_scalars(scalars)
        self.bus.publish(Evaluation(step=self.step, scalars=scalars, ms=(time.perf_counter() - started) * 1000))

    def seconds_to_act(self) -> float:
        """How long acting on a memory limit takes: the running step's end (twice the slowest recent step), a
        snapshot (the last one's time, or the state's size at a slow disk's speed), and a second to spare."""
        snapshot = self._snapshot_seconds
        if snapshot is None:
            snapshot = (self._state_bytes_estimate or 0) * ASSUMED_WRITE_SECONDS_PER_BYTE
        return 2 * max(self.step_ms_history, default=0.0) / 1000 + snapshot + 1.0

    def _check_time_limit(self) -> None:
        """Between steps (and while paused): once the time left is about what a snapshot takes, write the final
        one and exit, before the scheduler's SIGKILL can cost the run its progress. Under torchrun rank 0 alone
        decides, and its quit crosses to every rank: each rank deciding at its own turn wrote a sharded snapshot on
        rank 0 alone (a collective the others never joined) and ended the ranks at different boundaries."""
        assert self.time_limit is not None
        together = self.lockstep is not None and self.lockstep.world_size > 1
        if together and (self.lockstep.rank != 0 or self._time_limit_said):  # type: ignore[union-attr]
            return
        slowest = max(self.step_ms_history, default=0.0) / 1000
        if self.user_state is None or not self.time_limit.snapshot_due(self._snapshot_seconds, self._state_bytes(), slowest):
            return
        left = max(self.time_limit.remaining(), 0.0)
        self.bus.publish(Error(where="time limit", message=f"{self.time_limit.source}: {left:.0f} s left, about what the "
                               "final snapshot needs: writing it and exiting"))
        if together:
            self._time_limit_said = True
            self.commands.put(Quit(final_snapshot=True, reason="time limit"))  # every rank at one boundary, soon
            return
        self._final_snapshot()
        self._quit = True
        self._end_for("time limit")

    def _end_for(self, reason: str) -> None:
        """The exit's reason (unless the final snapshot failed, which the exit must say), and the requeue."""
        if self.exit_reason != "final snapshot failed":
            self.exit_reason = reason
        if self.requeue and (self.lockstep is None or self.lockstep.rank == 0):  # the job is requeued once, not per rank
            done, sentence = requeue_job()
            self.bus.publish(Error(where="requeued" if done else "requeue", message=sentence))  # a warning / an error

    def _state_bytes(self) -> int:
        """The tensors a snapshot writes, estimated once (before any snapshot has been timed)."""
        if self._state_bytes_estimate is None:
            modules, optimizers = find_with_globals(self.user_state, self._namespaces())
            # Parameters and buffers, not `state_dict()`: FSDP1's gathers every shard (a collective, and the whole
            # model's memory on each rank at once).
            self._state_bytes_estimate = payload_bytes(
                [[*m.parameters(), *m.buffers()] for m in modules.values()] + [o.state_dict() for o in optimizers.values()]
            ) + kept_state_bytes(lambda: find_loaders(self.user_state, self._namespaces()))  # an EMA: a model's worth
        return self._state_bytes_estimate

    def _final_snapshot(self, together: bool = False) -> None:
        """The quit's snapshot, and what it did (`final_snapshot`): failed means the exit status says so too.
        `together`: every rank takes it at this boundary (a lockstep command), as for `_snapshot`."""
        self._settle_values()
        if self.step == self._first_step:
            self.final_snapshot = FinalSnapshot("nothing trained", self.step)
        elif self.step == self.last_snapshot_step and self.last_snapshot_path is not None:
            self.final_snapshot = FinalSnapshot("up to date", self.step, path=self.last_snapshot_path)
        else:
            good_path, good_step = self.last_snapshot_path, self.last_snapshot_step
            if self._snapshot("final", together):
                self.final_snapshot = FinalSnapshot("written", self.step, path=self.last_snapshot_path)
            else:
                self.final_snapshot = FinalSnapshot(
                    "failed", self.step, error=self.last_snapshot_error, last_good_path=good_path, last_good_step=good_step
                )
                self.exit_code, self.exit_reason = 1, "final snapshot failed"
        if not self.final_snapshot.ok:
            self.bus.publish(Error(where="snapshot", message=self.final_snapshot.sentence()))

    def _snapshot(self, reason: str, together: bool = False) -> bool:
        """Write one; True if it was written (a failure is an error event and `last_snapshot_error`). `together`:
        under torchrun, every rank is here at the same boundary (a lockstep command), so rank 0's one-file snapshot
        can hold every rank's loader places (a gather); otherwise it holds its own."""
        sharded = self.lockstep is not None and is_sharded(self.user_state, self._namespaces())
        loaders = self._loader_record()
        # A one-file snapshot keeps rank 0's large states (an EMA's shadow weights), as it keeps rank 0's models: they
        # never cross between ranks. A sharded one writes their tensors through DCP (sharded_states.py).
        large = loaders.pop("large", {})
        loaders["tensors"], refused = self._changed_tensors()
        loaders.setdefault("errors", {}).update(refused)
        if self.lockstep is not None:
            loaders[random_states.RECORD_KEY] = random_states.capture()  # each rank's own (seeded apart, as a rule)
        gathered = together and self.lockstep is not None and not sharded
        if gathered and large:
            loaders["large_sums"] = fingerprints(large)  # rank 0 checks every rank's against its own (`differing`)
        ranks_places = self._every_ranks_places(loaders) if gathered else None
        if ranks_places is not None:
            differing(ranks_places)
        if self.lockstep is not None and self.lockstep.rank != 0 and not sharded:
            # Replicated state (DDP, or the same model on every rank): rank 0's snapshot holds it all.
            self.last_snapshot_step = self.step
            return True
        self.activity = f"writing snapshot of step {self.step}"  # large states take seconds: the status bar says so
        try:
            if sharded:  # every rank writes its shard (a lockstep command: all are here); rank 0 names the folder
                assert self.lockstep is not None
                writer = self.lockstep.plane.broadcast_json(os.getpid())  # rank 0's pid names the temp folder everywhere
                tensors, loaders[LAYOUT] = tensors_and_layout(large, self.lockstep.rank,
                                                              replicated_paths(large, self.lockstep.plane))
                event = write_sharded(self.user_state, self.step, self.reloader.version, self.bench.run_dir, writer,
                                      self.lockstep.rank == 0, self.snapshot_keep, self._namespaces(), self._changed_globals(),
                                      loader_record=loaders, large=tensors, optimizers_as_made=self.optimizers_as_made,
                                      code=self._code_record() if self.lockstep.rank == 0 else None)
            else:
                rank, world_size = (self.lockstep.rank, self.lockstep.world_size) if self.lockstep else (0, 1)
                event = write_snapshot(
                    self.user_state, self.step, self.reloader.version, self.bench.run_dir, self.snapshot_keep, self._namespaces(),
                    self._changed_globals(), loader_places=places(ranks_places or {rank: loaders}, world_size, large),
                    optimizers_as_made=self.optimizers_as_made, code=self._code_record(),
                )
        except Exception as exc:  # noqa: BLE001 - a snapshot failing must not stop training
            self.last_snapshot_error = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            where = f" on rank {self.lockstep.rank}" if self.lockstep is not None else ""
            self.bus.publish(Error(where="snapshot", message=f"snapshot of step {self.step} failed{where}: {self.last_snapshot_error}",
                                   traceback=None if isinstance(exc, UserError) else self._format(exc)))
            return False
        finally:
            self.activity = None
        self.last_snapshot_step, self.last_snapshot_path, self.last_snapshot_error = self.step, event.path, None
        self._snapshot_seconds = event.seconds
        self._update_run_record()
        records = ranks_places or {self.lockstep.rank if self.lockstep is not None else 0: loaders}
        self.bus.publish(dataclasses.replace(event, reason=reason, left_out=left_out(records, large)))
        return True

    def _code_record(self) -> dict[str, Any] | None:
        """Which code the run is running, for a resume to compare with the files then (code_on_record.py); None
        when it cannot be taken: the snapshot goes on without it, and its resume claims nothing about the code."""
        try:
            return code_record(self.reloader, self.project.relative)
        except Exception:  # noqa: BLE001 - a snapshot must not fail for want of its code record
            return None

    def _changed_tensors(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The tensors training changed in setup()'s state and module globals (training_tensors.py); a failure is
        said in the snapshot's `left_out`, never a reason for the snapshot to fail."""
        try:
            modules, _ = find_with_globals(self.user_state, self._namespaces())
            return self.training_tensors.changed(self._training_namespaces(), list(modules.values()))
        except Exception as exc:  # noqa: BLE001 - the snapshot goes on without them
            return {}, {"(training's tensors)": f"{type(exc).__name__}: {exc}"}

    def _loader_record(self) -> dict[str, Any]:
        """Where this rank's stateful data loaders are (loader_places.py); a loader whose state cannot be taken is
        named in the record, never a reason for the snapshot to fail."""
        try:
            return loader_record(find_loaders(self.user_state, self._namespaces()))
        except Exception as exc:  # noqa: BLE001 - the walk itself failing: the snapshot goes on without places
            return {"states": {}, "errors": {"(the state)": f"{type(exc).__name__}: {exc}"}}

    def _every_ranks_places(self, mine: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Every rank's loader record, for rank 0's one-file snapshot (each rank's loader reads its own shard). A
        collective: only where every rank takes this snapshot at the same boundary. A rank gone raises RanksLost."""
        assert self.lockstep is not None
        every = self.lockstep.plane.gather_bytes(pack_places(mine))
        return {rank: unpack_places(raw) for rank, raw in enumerate(every) if raw}

    def _changed_globals(self) -> dict[str, Any]:
        return self.training_globals.changed(self._plain_value_namespaces(), self.setup_rebinds.bound_since_setup())

    def _update_run_record(self, **extra: Any) -> None:
        if self.run_record is not None:
            loss = self.telemetry.latest("loss")
            self.run_record.update(step=self.step, code_version=self.reloader.version, last_loss=loss, **extra)

    def _start_memory_recording(self) -> None:
        if not self.record_memory:
            return
        if self._gpu_index is None:
            self.bus.publish(Error(where="memory snapshot", message="--record-memory needs a CUDA device; not recording"))
            return
        try:
            start_recording()
            self._recording = True
        except Exception as exc:  # noqa: BLE001
            self.bus.publish(Error(where="memory snapshot", message=f"could not record CUDA memory history: {exc}"))

    def _dump_memory(self, reason: str) -> MemorySnapshotTaken:
        return dump_snapshot(self.bench.run_dir, self._gpu_index is not None, self._recording, reason)

    def _after_code_change(self) -> None:
        """After a handler changed the live code: a failed setup() runs again, a pause for an error ends."""
        if self.state is RunState.SETUP_FAILED:
            self._run_setup()
        elif self.state is RunState.PAUSED and self.pause_reason in AUTO_RESUME_REASONS:
            if self.broken is not None:
                self._recover()  # rebuilds, then resumes if it worked
            else:
                self._resume("reload")

    def _recover(self) -> None:
        """On every rank at the same boundary under torchrun: new groups if the old died, then a rebuild (which resumes).

        A dead training group cannot be repaired, a DDP wrapper whose reducer failed refuses every step, and a
        generator in the state that an error ended has no more items (also in one process), so the state is built
        again by setup() on every rank, weights and optimizer state carried over."""
        assert self.broken is not None
        broken, self.broken = self.broken, None
        main = self.lockstep is None or self.lockstep.rank == 0
        if main:
            everywhere = " on every rank" if self.lockstep is not None else ""
            self.bus.publish(Error(where="recovery", message=f"{broken.reason}: rebuilding{everywhere} before training goes on"
                                   + (" (the process groups are made again first)" if broken.renew_group else "")
                                   + self._what_a_recovery_builds()))
        if broken.renew_group:
            assert self.lockstep is not None
            try:
                self.lockstep.renew_groups()
            except Exception as exc:  # noqa: BLE001 - then nothing can train: say so, stay paused
                self.broken = broken
                self.bus.publish(Error(where="rebuild", message=f"could not make the process groups again: {exc}; "
                                       "stop and start the run again (--resume latest)"))
                return
        dispatch(self, Rebuild())
        if self.state is RunState.PAUSED:
            self.broken = Broken(broken.reason)  # the rebuild failed: the next fix tries again (the groups are new now)
            if main:
                who = "every rank stays" if self.lockstep is not None else "training stays"
                self.bus.publish(Error(where="rebuild", message=f"{who} paused: {broken.reason}, so the old "
                                       "state cannot train. Fix what the rebuild's error names and save (the rebuild "
                                       "runs again), or roll back (command `rollback`)"))
            return
        if self.lockstep is None:
            return
        # The failed step may have left the replicas apart (gradients never reduced): rank 0's copy goes to every rank.
        sent = broadcast_replicated_state(self.user_state, self._namespaces())
        if self.lockstep.rank == 0 and sent:
            self.bus.publish(Error(where="recovery", message=f"every rank now holds rank 0's weights and optimizer state "
                                   f"({sent} tensors broadcast; sharded ones, if any, stay each rank's own)"))

    def _what_a_recovery_builds(self) -> str:
        """A recovery's rebuild is R's: what earlier saves left for R comes in with it, which the user did not ask for
        (an x-transformers trainer, ported: a held DEPTH edit added a freshly initialized layer, and an edited learning
        rate took effect, when a one-rank fix was saved)."""
        held = sorted({name for changeset in self._held.values() for name in changeset.changed})
        since_built = [v for v in self.reloader.history if v.version > self._state_built_at]  # what its notes said
        left = [name for name in dict.fromkeys(name for v in since_built for name, _ in (*v.built_from, *v.setup_calls))
                if name not in held]
        statements = [label for pending in self._statements.values() for label, _ in pending]  # x's, which R runs
        parts = ([f"held back: {', '.join(held)}"] if held else []) + ([f"built with: {', '.join(left)}"] if left else []) \
            + ([f"module statements left for x: {', '.join(statements)}"] if statements else [])
        if not parts:
            return ""
        return f". Like R, it builds from the code and values on disk, so what earlier saves left for R comes in now: " \
               f"{'; '.join(parts)}"

    # Helpers -----------------------------------------------------------------------------
    def _pause(self, reason: str, announce: bool = True) -> None:
        self._settle_values()
        self.state, self.pause_reason = RunState.PAUSED, reason
        self._pause_announced = False
        self.bus.publish(Paused(reason=reason, step=self.step))
        if self.lockstep is not None:
            if announce and is_error_pause(reason):
                # Decided by this rank alone (its step failed): every rank pauses at the next agreed boundary.
                self.lockstep.announce_pause(self, reason, self._failure)
            if self.exit_on_error_pause and reason in ENDS_RUN_WITHOUT_INPUT:
                self.lockstep.end_run(self, reason)  # every rank ends together, one boundary later
        elif self.exit_on_error_pause and reason in ENDS_RUN_WITHOUT_INPUT:
            self.end_without_input(reason)

    def end_without_input(self, reason: str) -> None:
        """A pause nobody can resume (headless, stdin closed) ends the run: with exit code 1 for a failure; for the
        data's end, the run's natural end as for a plain loop, with a final snapshot of the trained model and code 0;
        for the user's pause, as SIGTERM ends a run: a final snapshot, code 0, reason `input closed`."""
        if reason in AUTO_RESUME_REASONS:
            self.exit_code, self.exit_reason = 1, reason
        else:
            self._final_snapshot(together=True)  # on every rank under torchrun (EndRun): sharded state needs each rank's shard
            if self.exit_reason != "final snapshot failed":
                self.exit_code, self.exit_reason = 0, (reason if reason == DATA_EXHAUSTED else "input closed")
        self._quit = True

    # Under torchrun ------------------------------------------------------------------------
    def _agree_on_setup(self) -> None:
        """Every rank's setup() outcome: if one failed, none trains (its error, naming the rank, is said once)."""
        assert self.lockstep is not None
        failures = self.lockstep.plane.gather_json(self.setup_error)
        failed = [(rank, error) for rank, error in enumerate(failures) if error is not None]
        if not failed or self.setup_error is not None:
            return
        if self.lockstep.rank == 0:
            rank, error = failed[0]
            self.bus.publish(Error(where="setup", message=f"rank {rank}: {error}"))
            self.setup_error = f"rank {rank}: {error}"
        self.state = RunState.SETUP_FAILED
        if self.exit_on_setup_failure:
            self.exit_code, self.exit_reason, self._quit = 2, "setup failed", True

    def _ranks_lost(self, exc: RanksLost) -> None:
        """Another rank is gone: no collective can complete, so this rank ends alone. Rank 0 first writes what
        it holds (replicated state: the whole model) unless its last snapshot is up to date."""
        self._lost = True
        self.bus.publish(Error(where="ranks", message=f"{exc}; this rank stops (torchrun's report names the rank that "
                               "ended first)"))
        if self.lockstep is not None and self.lockstep.rank == 0 and self.user_state is not None:
            if is_sharded(self.user_state, self._namespaces()):
                self.bus.publish(Error(where="snapshot", message="no final snapshot: sharded state needs every rank to "
                                       f"write it; the last one is {self.last_snapshot_path or 'none'}"))
            else:
                self._final_snapshot()
        if self.exit_reason != "final snapshot failed":
            self.exit_code, self.exit_reason = 1, "rank lost"
        self._quit = True

    def _finish_lockstep(self) -> None:
        """After the loop: the exchange every rank posted at the last boundary is collected, so none waits on it."""
        assert self.lockstep is not None
        try:
            self.lockstep.finish(self)
        except Exception as exc:  # noqa: BLE001 - a rank gone: said, and this one still exits
            self.bus.publish(Error(where="worker", message=f"the ranks' last exchange failed: {exc}"))

    def _resume(self, reason: str) -> None:
        self.resumes += 1  # at one boundary on every rank (only commands resume): a failure from before is stale
        self.state, self.pause_reason = RunState.RUNNING, None
        if self.lockstep is not None:
            self.lockstep.resumed(self)  # --eval-every's next turn, from where rank 0 stands
        self.bus.publish(Resumed(reason=reason, step=self.step))

    def _command_error(self, message: str) -> None:
        self.bus.publish(Error(where="command", message=message))

    def _publish_or_report(self, what: str, action: Any) -> None:
        try:
            self.bus.publish(action())
        except Exception as exc:  # noqa: BLE001 - an action failing must not stop training
            self.bus.publish(Error(where=what, message=f"{what} failed: {type(exc).__name__}: {exc}", traceback=self._format(exc)))

    def _live_source(self, filename: str) -> str | None:
        """A project file's live source (what its running code was compiled from), or None."""
        return self.reloader.applied_source(Path(filename).resolve()) if self.project.owns(filename) else None

    def _project_relative(self, path: str) -> str | None:
        """`path` relative to the project, or None for a file outside it."""
        return self.project.relative(path) if self.project.owns(path) else None

    def _where(self, exc: BaseException) -> tuple[str | None, int | None]:
        found = deepest_frame_in(exc, self.project.root)
        if found is None:
            return None, None
        return self.project.relative(found[0]), found[1]

    def _format(self, exc: BaseException) -> str:
        """The traceback without the workbench's own frames: the user's code is what matters."""
        package = os.path.dirname(workbench.__file__)
        tb = true_stack(exc, self.reloader.history, self._live_source)  # the lines of the code that runs
        tb.stack = traceback.StackSummary.from_list([f for f in tb.stack if not f.filename.startswith(package)])
        return format_traceback(tb)


def _initialized_note(initialized: list[str]) -> tuple[str, ...]:
    if not initialized:
        return ()
    shown = ", ".join(initialized[:6]) + (f" and {len(initialized) - 6} more" if len(initialized) > 6 else "")
    return (f"not in the snapshot, so initialized as setup() does: {shown}",)


def _failed_resume(exc: Exception, path: Path, ends: bool) -> ResumeLoaded:
    """A resume that loaded nothing, one-file or sharded: why (a snapshot that does not fit names what differs), and
    what happens now: headless (`ends`) the run ends with exit code 2; the app pauses on what setup() built. (It said
    that training started from setup()'s state where the headless run exited at once.)"""
    report = getattr(exc, "report", None)
    if report is not None:
        message = f"nothing was loaded from {path}: {report.problems()}; --resume-partial loads what matches"
    elif isinstance(exc, UserError):
        message = str(exc).rstrip(".")
    else:
        message = f"resuming from {path} failed ({type(exc).__name__}: {exc}); nothing was loaded"
    message += ("; the run ends (exit code 2): fix what is said, or start without --resume" if ends else
                "; paused on what setup() built (initialized as usual): resume to train it from its start, or quit")
    return ResumeLoaded(ok=False, path=str(path), error=message, missing=tuple(report.missing) if report else (),
                        unexpected=tuple(report.unexpected) if report else (),
                        mismatched=tuple(report.mismatched) if report else ())
