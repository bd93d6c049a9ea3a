"""A training session: the facade front ends use.

It wires the training thread, the file watcher, the reload thread and the
memory sampler together; front ends read `status()` and `telemetry`, subscribe
to `bus`, and `send` commands. It never imports a UI.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from workbench import __version__
from workbench.engine.bench import Bench
from workbench.engine.early_output import EarlyOutput
from workbench.protocol.eventbus import EventBus
from workbench.engine.eventlog import EventLogWriter
from workbench.protocol.events import Command, Error, Interrupt, Pause, Quit, ReloadNow, Start
from workbench.engine.actions.leftovers import remove_leftovers
from workbench.engine.actions.snapshot import DEFAULT_KEEP
from workbench.engine.hotswap.planner import ChangeSet
from workbench.engine.hotswap.reloader import DEFAULT_MAX_HISTORY, Reloader
from workbench.engine.hotswap.service import ReloadService
from workbench.engine.hotswap.filesystem import filesystem_type, is_shared
from workbench.engine.hotswap.poller import SHARED_POLL_SECONDS, SavePoller
from workbench.engine.hotswap.watcher import DEBOUNCE_MS, STEP_MS, SourceWatcher
from workbench.engine.memory.device import DeviceProbe, TorchNvmlProbe
from workbench.engine.memory.cgroup import previous_oom_kills_note
from workbench.engine.memory.host import read_host_memory
from workbench.engine.memory.sampler import HostReader, MemorySample, MemorySampler
from workbench.engine.memory_guard import MemoryGuard
from workbench.engine.output import OutputRouter
from workbench.protocol.status import SessionStatus
from workbench.engine.project import Project, ignored_hooks, unload_project
from workbench.engine.runs import RUNS, RunRecord, leftover_folders, new_run_folder
from workbench.engine.state_folder import choose_state_folder
from workbench.engine.telemetry import Telemetry
from workbench.engine.thread_device import use_on_this_thread
from workbench.engine.time_limit import TimeLimit
from workbench.units import human_bytes
from workbench.engine.watchdog import StepWatchdog
from workbench.engine.whereabouts import IN_USER_CODE, Board, RankWatch, takes_interrupt
from workbench.engine.worker import ApplyChanges, RunState, TrainingWorker
from workbench.engine.distributed import RankRole, shared_store_restart_note
from workbench.engine.launcher_watch import LauncherWatch
from workbench.engine.lockstep import Lockstep

REQUIRED_FUNCTIONS = {"setup": ("bench",), "step": ("state", "bench")}


@dataclass(frozen=True)
class SessionConfig:
    device: torch.device
    max_steps: int | None = None
    exit_at_max_steps: bool = True
    exit_on_setup_failure: bool = False
    start_paused: bool = False
    watch: bool = True
    capture_output: bool = True
    write_event_log: bool = False
    eval_every: int | None = None
    snapshot_every: int | None = None  # --snapshot-every N: a snapshot after every Nth step
    resume: Path | None = None  # a snapshot to load after setup() (`--resume`)
    resume_partial: bool = False
    snapshot_keep: int = DEFAULT_KEEP
    slow_step_factor: float = 10.0  # warn when a step runs this many times its median...
    slow_step_seconds: float = 5.0  # ...and at least this long
    record_memory: bool = False  # CUDA allocation history for memory snapshots (python stacks)
    max_history: int = DEFAULT_MAX_HISTORY  # code versions kept for rollback (each holds its old code)
    sample_memory: bool = True
    memory_interval: float = 0.1  # 10 Hz
    memory_idle_interval: float | None = 0.5  # 2 Hz while paused (None: always memory_interval)
    memory_window: float = 300.0  # seconds of memory history the gauges draw
    memory_event_interval: float = 2.0
    debounce_ms: int = DEBOUNCE_MS
    step_ms: int = STEP_MS
    poll_seconds: float | None = None  # saves found by looking every N s (poller.py); None: where file events are blind
    freeze_gc: bool = True  # gc.freeze() after setup: full collections skip the long-lived objects
    training_nice: int = 0  # lower the training thread's CPU priority by this much (thread_priority.py)
    tensorboard: bool = False  # TensorBoard event files in the run folder (tensorboard_log.py; optional extra)
    time_limit: TimeLimit | None = None  # the job's wall-clock limit: final snapshot and exit before it (time_limit.py)
    requeue: bool = False  # after a requeue signal or the time limit's snapshot, requeue the batch job (Slurm)
    requeue_signal: str = "USR1"  # the signal that means "snapshot now, requeue, exit 0"
    on_memory_limit: str = "snapshot"  # memory_guard.py: before a forecast kill, snapshot and pause / pause / warn


def _join(thread: threading.Thread | None, timeout: float) -> None:
    if thread is not None and thread.ident is not None:
        thread.join(timeout)


def resolve_device(spec: str) -> torch.device:
    """`auto` picks CUDA when torch can use it; an explicit `cuda` without a GPU is the user's to fix."""
    from workbench.errors import UserError

    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UserError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda was asked for, but torch.cuda.is_available() is False on this machine.", hint="Use --device cpu (or auto).")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    elif device.type != "cpu":
        raise UserError(f"--device {spec!r} is not supported; use auto, cpu, cuda or cuda:N.")
    return device


class Session:
    def __init__(
        self,
        project: Project,
        config: SessionConfig,
        *,
        probe: DeviceProbe | None = None,
        stdout_passthrough: TextIO | None = None,
        host_reader: HostReader = read_host_memory,
        early_output: EarlyOutput | None = None,
        ranks: RankRole | None = None,
    ) -> None:
        self.project = project
        self.ranks = ranks  # under torchrun: this rank and the control plane; rank 0 alone watches and serves
        self._early_output = early_output  # what the project printed while it was imported
        self.config = config
        self.bus = EventBus(ends_at_exit=True)
        self.telemetry = Telemetry(memory_history=int(config.memory_window / max(config.memory_interval, 0.01)) + 1)
        self.probe: DeviceProbe = probe or TorchNvmlProbe()
        # The project's state folder (a UserError before anything starts), and this session's own run folder in it.
        self.state_dir, self._run_dir_note = choose_state_folder(project.root)
        if config.tensorboard:
            from workbench.engine.tensorboard_log import require_tensorboardx

            require_tensorboardx()  # a missing extra is one line, before a run folder is made for nothing
        self.run_dir = self._shared_run_folder() if ranks is not None else new_run_folder(self.state_dir)
        self.run_record = RunRecord(self.run_dir)
        self.bench = Bench(config.device, self.run_dir, ranks.info if ranks is not None else None)
        self.reloader = Reloader(project, REQUIRED_FUNCTIONS, config.max_history)
        self.router = (
            OutputRouter(self.bus.publish, stdout=stdout_passthrough) if config.capture_output else None
        )
        self.worker = TrainingWorker(
            project,
            self.bench,
            self.reloader,
            self.bus,
            self.telemetry,
            self.probe,
            self.router,
            max_steps=config.max_steps,
            exit_at_max_steps=config.exit_at_max_steps,
            exit_on_setup_failure=config.exit_on_setup_failure,
            start_paused=config.start_paused,
            eval_every=config.eval_every,
            snapshot_every=config.snapshot_every,
            record_memory=config.record_memory,
            resume=config.resume,
            resume_partial=config.resume_partial,
            snapshot_keep=config.snapshot_keep,
            run_record=self.run_record if self.is_main else None,
            time_limit=config.time_limit,
            requeue=config.requeue,
            on_memory_limit=config.on_memory_limit,
            freeze_gc=config.freeze_gc,
            nice=config.training_nice,
        )
        if ranks is not None:
            doorbell = ranks.groups.doorbell()
            ahead = ranks.groups.prepare_ahead(self._plan_from_source)
            self.worker.lockstep = Lockstep(ranks.plane, ranks.groups, doorbell, ahead)
            self.worker.commands.on_put = self._ring_doorbell
        self.reload_service = ReloadService(self.reloader, self._submit_changes, self.bus.publish,
                                            announce=self._announce_source if ranks is not None else None,
                                            on_start=lambda: use_on_this_thread(self.bench.device))
        self.watcher: SourceWatcher | SavePoller | None = None
        self._watching_note: str | None = None
        if config.watch and self.is_main:  # rank 0 watches; the others receive its sources
            self.watcher, self._watching_note = self._make_watcher(config)
        self.memory_guard = MemoryGuard(
            self.bus.publish, self.worker.commands.put, self.worker.seconds_to_act, config.on_memory_limit,
            step_count=lambda: self.worker.step,
        )
        self.sampler = MemorySampler(
            self.probe,
            self._store_memory,
            self.bus.publish,
            interval=config.memory_interval,
            event_interval=config.memory_event_interval,
            read_host=host_reader,
            step_count=lambda: self.worker.step,
            idle=lambda: self.worker.state is RunState.PAUSED,
            idle_interval=config.memory_idle_interval,
        )
        # Under torchrun: the launcher, this process's parent, as it was at the start (it could be pid 1 in a container).
        self.launcher_watch = LauncherWatch(self._launcher_gone) if ranks is not None else None
        self._interrupt_board: Board | None = None  # rank 0 under torchrun: `i` reaches every held rank through it
        self._rank_watch: RankWatch | None = None
        rank_watch = None
        if ranks is not None:
            store, info = ranks.groups.whereabouts_store(), ranks.info
            rank_watch = RankWatch(self.worker, Board(store, info.rank, info.world_size), self.bus.publish,
                                   slow_factor=config.slow_step_factor, slow_seconds=config.slow_step_seconds,
                                   collective_timeout=ranks.groups.collective_timeout.total_seconds())
            if info.is_main:
                self._interrupt_board, self._rank_watch = Board(store, info.rank, info.world_size), rank_watch
        self.watchdog = StepWatchdog(
            self.worker, self.bus.publish, factor=config.slow_step_factor, minimum=config.slow_step_seconds,
            rank_watch=rank_watch,
        )
        # Under torchrun every rank keeps its complete log, whatever the front end: rank 0's is `events.jsonl`, as
        # for one process (headless once wrote it as events-rank0.jsonl, which no note or document named).
        # Headless in one process writes none: its stdout is that stream.
        self.event_log = (
            EventLogWriter(self.bus, self.run_dir / "events.jsonl")
            if self.is_main and (config.write_event_log or ranks is not None)
            else EventLogWriter(self.bus, self.run_dir / f"events-rank{ranks.info.rank}.jsonl") if ranks is not None
            else None
        )
        self.tensorboard = self._tensorboard_log() if config.tensorboard and self.is_main else None
        self._started = False
        self._final_snapshot = False
        self._stopped = threading.Event()

    # Lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start every thread; `setup` runs on the training thread, so this returns at once."""
        if self._started:
            return
        self._started = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.reloader.track_loaded_modules()
        if self.router is not None:
            self.router.install()
        self.bus.publish(
            Start(
                project=self.project.name,
                device=str(self.config.device),
                version=__version__,
                torch=torch.__version__,
                pid=os.getpid(),
                rank=self.ranks.info.rank if self.ranks is not None else None,
                world_size=self.ranks.info.world_size if self.ranks is not None else None,
                backend=self.ranks.backend if self.ranks is not None else None,
                restart=(self.ranks.info.restart or None) if self.ranks is not None else None,
            )
        )
        if self._early_output is not None:
            self._early_output.connect(self.bus.publish)
        for note in ignored_hooks(self.project.module.__dict__):
            self.bus.publish(Error(where="contract", message=note))
        if self._run_dir_note:
            self.bus.publish(Error(where="run folder", message=self._run_dir_note))
        if (oom_note := previous_oom_kills_note()) is not None:
            self.bus.publish(Error(where="memory limit", message=oom_note))
        if not self.is_main:
            self._start_threads()
            return
        if self.ranks is not None and (restart_note := shared_store_restart_note(self.ranks.info)) is not None:
            self.bus.publish(Error(where="torchrun", message=restart_note))
        for note in self.ranks.groups.skipped_inits if self.ranks is not None else ():
            self.bus.publish(Error(where="torchrun", message=note))
        self.run_record.start(str(self.project.entry), self.config.resume)
        if self._watching_note is not None:
            self.bus.publish(Error(where="watching", message=self._watching_note))
        for leftover in remove_leftovers(leftover_folders(self.state_dir)):
            self.bus.publish(
                Error(
                    where="run folder",
                    message=f"removed {leftover.path} ({human_bytes(leftover.bytes)}): a temp file its writer (pid "
                    f"{leftover.writer_pid}, no longer running) left when it was killed mid-write",
                )
            )
        self._start_threads()

    def _start_threads(self) -> None:
        if self.event_log is not None:
            self.event_log.start()
        if self.tensorboard is not None:
            self.tensorboard.start()
        if self.config.sample_memory:
            self.sampler.start()
        self.reload_service.start()
        if self.watcher is not None:
            self.watcher.start()
        self.worker.start()
        self.watchdog.start()
        if self.launcher_watch is not None:
            self.launcher_watch.start()

    def wait_until_watching(self, timeout: float = 10.0) -> bool:
        """True once file saves are being watched (tests and benchmarks wait for this)."""
        return self.watcher is None or self.watcher.ready.wait(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the training thread to end; True if it has."""
        self.worker.join(timeout)
        return not self.worker.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the training thread to finish its step and stop, then stop the helpers."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._started:
            # A start that failed part way (an unusable run folder) left some threads unstarted: join only started ones.
            self.worker.commands.put(Quit())
            _join(self.worker, timeout)
            if self.watcher is not None:
                self.watcher.stop()
            self.reload_service.stop()
            self.sampler.stop()
            self.watchdog.stop()
            if self.launcher_watch is not None:
                self.launcher_watch.stop()
            for thread in (self.watcher, self.reload_service, self.sampler):
                _join(thread, 2.0)
            if self.event_log is not None:
                self.event_log.stop()
                _join(self.event_log, 2.0)
            if self.tensorboard is not None:
                self.tensorboard.stop()
        if self.router is not None:
            self.router.uninstall()

    def _launcher_gone(self, launcher_pid: int) -> None:
        """From the launcher watch: stop as the launcher's SIGTERM would have stopped this rank, escalation included
        (the front end's handler: a final snapshot on rank 0, a step that never ends interrupted, then ended)."""
        assert self.ranks is not None
        self.bus.publish(Error(where="launcher", message=(
            f"rank {self.ranks.info.rank}: the launcher (torchrun, pid {launcher_pid}) is gone, so nothing would stop "
            "this rank or restart the job: stopping as its SIGTERM would (rank 0 writes a final snapshot)")))
        os.kill(os.getpid(), signal.SIGTERM)

    def request_quit(self, final_snapshot: bool = False, reason: str = "quit") -> None:
        """Ask the training thread to stop after its step (writing a final snapshot first if asked)."""
        self._final_snapshot = self._final_snapshot or final_snapshot
        self.worker.commands.put(Quit(final_snapshot=final_snapshot, reason=reason))

    def close(self) -> None:
        """Stop and forget the project's modules (several sessions may share one process)."""
        # A final snapshot of a large model can take a while: give it time before giving up.
        self.stop(timeout=600.0 if self._final_snapshot else 10.0)
        unload_project(self.project)

    @property
    def is_main(self) -> bool:
        """Rank 0 under torchrun, or the only process: the one that watches files, writes snapshots, has front ends."""
        return self.ranks is None or self.ranks.info.is_main

    def _shared_run_folder(self) -> Path:
        """One run folder for every rank: rank 0 makes it and tells the others its name."""
        assert self.ranks is not None
        name = new_run_folder(self.state_dir).name if self.ranks.info.is_main else None
        return self.state_dir / RUNS / self.ranks.plane.broadcast_json(name)

    @property
    def last_profile(self):  # type: ignore[no-untyped-def]
        return self.worker.last_profile

    # What the app reads (workbench/protocol/source.py), in process as over a socket.
    @property
    def project_root(self) -> Path:
        return self.project.root

    @property
    def memory_window(self) -> float:
        return self.config.memory_window

    @property
    def ended(self) -> str | None:
        return "the session ended" if self.worker.state is RunState.STOPPED else None

    @property
    def last_snapshot(self) -> str | None:
        return self.worker.last_snapshot_path

    @property
    def unsaved_steps(self) -> int:
        """Steps trained since the last snapshot (or since start): what quitting now would lose."""
        w = self.worker
        if w.user_state is None:
            return 0
        return w.step - (w.last_snapshot_step or 0)

    @property
    def exit_code(self) -> int:
        return self.worker.exit_code

    # Front-end API -----------------------------------------------------------------------
    def send(self, command: Command) -> None:
        """Non-blocking; applied by the training thread between steps (reloads by the reload thread)."""
        if isinstance(command, ReloadNow):
            self._reload(command.file)
        elif isinstance(command, Interrupt):
            if self._interrupt_board is not None:
                self._interrupt_ranks()
            elif not self.worker.interrupt():
                self.bus.publish(Error(where="command", message="no step or evaluate() is running: nothing to interrupt"))
        else:
            self.worker.commands.put(command)
            started = self.worker.step_started
            running = time.monotonic() - started if started is not None else 0.0
            if isinstance(command, Pause) and running >= 1.0 and self.worker.state is RunState.RUNNING:
                # Applied at the step boundary: said at once, so a long step does not look like an ignored key.
                self.bus.publish(Error(where="pausing", message=f"pausing after the current step (running for {running:.0f} s; "
                                       "i interrupts it)"))

    def _reload(self, file: str) -> None:
        """Every project file, or the one named: a file outside the project or not there is the caller's mistake,
        said, not a "no code changes" that would read as if the reload had looked at it."""
        if not file:
            self.reload_service.rescan()
            return
        path = self.project.root / file
        if not path.is_file() or not self.project.owns(path) or path.suffix != ".py":
            why = "is not a Python file of the project" if path.exists() else "does not exist"
            self.bus.publish(Error(where="command", message=f"reload {file}: {path} {why}; name a .py file by its "
                                   f"path relative to the project folder ({self.project.root}), or send `reload` "
                                   "alone to re-read every file"))
            return
        self.reload_service.files_changed({path.resolve()}, time.monotonic())  # as a watcher names it (held changes)

    def _interrupt_ranks(self) -> None:
        """Under torchrun: this rank's step, and every other rank held in a step (they read the store's counter)."""
        assert self._interrupt_board is not None and self._rank_watch is not None
        here = self._rank_watch.interrupt_here()
        try:
            self._interrupt_board.interrupt()
            places = [p for p in self._interrupt_board.places().values() if p.kind in IN_USER_CODE and p.rank != 0]
        except Exception as exc:  # noqa: BLE001 - the store gone: this rank's own interrupt still went
            self.bus.publish(Error(where="command", message=f"the other ranks could not be told to interrupt "
                                   f"({type(exc).__name__}: {exc})"))
            return
        taking = sorted(p.rank for p in places if takes_interrupt(p)) + ([0] if here else [])
        waiting = sorted(p.rank for p in places if not takes_interrupt(p))
        if not taking and not waiting:
            self.bus.publish(Error(where="command", message="no step or evaluate() is running: nothing to interrupt"))
            return
        said = []
        if taking:
            what = "evaluate()" if any(p.kind == "evaluate" for p in places) or self.worker.evaluate_started else "the step"
            said.append(f"interrupting {what} of rank{'s' if len(taking) > 1 else ''} {', '.join(map(str, sorted(taking)))} "
                        "(at its next line of Python)")
        if waiting:
            said.append(f"rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} wait{'' if len(waiting) > 1 else 's'} "
                        "idle inside torch (a collective, most likely) and {} left to it".format("are" if len(waiting) > 1 else "is"))
        self.bus.publish(Error(where="waiting", message="; ".join(said)))

    def status(self) -> SessionStatus:
        w = self.worker
        elapsed = w.setup_seconds if w.setup_seconds is not None else time.monotonic() - w.setup_started
        return SessionStatus(
            project=self.project.name,
            device=str(self.config.device),
            state=w.state.value,
            pause_reason=w.pause_reason,
            step=w.step,
            steps_per_second=self.telemetry.steps_per_second() if w.state is RunState.RUNNING else 0.0,
            code_version=self.reloader.version,
            setup_elapsed=elapsed,
            setup_error=w.setup_error,
            profiling=w.profiling,
            last_step_ms=self.telemetry.last_step_ms,
            needs_rebuild=tuple(self.project.relative(p) for p in list(w.held_paths())),
            activity=w.activity,
            unsaved_steps=self.unsaved_steps,
            memory_warning=self.memory_guard.warning,
            last_snapshot=self.last_snapshot,
            held=self._rank_watch.held if self._rank_watch is not None else None,
        )

    # Internals ---------------------------------------------------------------------------
    def _store_memory(self, sample: MemorySample) -> None:
        """On the sampler's thread: the gauges' history, and the forecast of a memory limit."""
        self.telemetry.store_memory(sample)
        self.memory_guard.observe(sample)

    def _tensorboard_log(self):  # type: ignore[no-untyped-def]
        from workbench.engine.tensorboard_log import TensorBoardLog

        return TensorBoardLog(self.bus, self.run_dir, resumed_from=self.config.resume)

    def _ring_doorbell(self) -> None:
        """Any rank: a command was queued; the ranks exchange soon rather than at the cadence's turn (a rank > 0 asks
        rank 0 to propose the turn)."""
        lockstep = self.worker.lockstep
        if lockstep is not None and lockstep.doorbell is not None:
            lockstep.doorbell.ring()

    def _submit_changes(self, prepared) -> None:  # type: ignore[no-untyped-def]
        self.worker.commands.put(ApplyChanges(prepared))

    def _announce_source(self, path: Path, source: str) -> None:
        """Rank 0's reload thread, as it starts planning a saved file: the other ranks start planning it too."""
        lockstep = self.worker.lockstep
        if lockstep is not None and lockstep.ahead is not None:
            lockstep.ahead.announce(self.project.relative(path), source)

    def _plan_from_source(self, path: str, source: str) -> ChangeSet | None:
        """Ranks > 0, on the planning-ahead thread: rank 0's source for a file, planned as rank 0 planned it."""
        use_on_this_thread(self.bench.device)  # planning runs the file's new imports: on this rank's GPU
        return self.reloader.prepare((self.project.root / path).resolve(), source=source)

    def _make_watcher(self, config: SessionConfig) -> tuple[SourceWatcher | SavePoller, str | None]:
        """File events, or a poller of the files the session runs where file events cannot see every save; the note
        that says which, and why, when it is the poller."""
        fstype = filesystem_type(self.project.root)
        interval = config.poll_seconds
        if interval is None:
            interval = SHARED_POLL_SECONDS if is_shared(fstype) else 0.0
        if not interval:
            watcher = SourceWatcher(self.project.root, self.reload_service.files_changed, self._watch_failed,
                                    debounce_ms=config.debounce_ms, step_ms=config.step_ms)
            return watcher, None
        poller = SavePoller(self.reloader.tracked_files, self.reload_service.files_changed, self._watch_failed,
                            interval, live_source=self.reloader.applied_source)
        if config.poll_seconds is None:
            why = (f"the project folder is on {fstype}, where a save made on another machine gives no file event here, "
                   f"so the files the session runs are looked at every {interval:g} s instead (--poll-saves N sets "
                   "how often; --poll-saves 0 uses file events)")
        else:
            why = f"saves are found by looking at the files the session runs every {interval:g} s (--poll-saves)"
        return poller, why

    def _watch_failed(self, message: str) -> None:
        self.bus.publish(Error(where="watcher", message=message))
