"""`rebuild`: apply held changes, run setup() again, carry the trained state over (tensors, optimizer state, LR
schedules), free the old state.

Under torchrun every rank rebuilds at the same boundary, and the ranks agree before any keeps its new state:
if setup() failed on one rank, the others drop what they built and every rank goes on with its old state and
code, so no rank trains a model the others do not have.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from workbench.engine import random_states
from workbench.engine.ranks_carried import carried_summary, differing_ranks_notes
from workbench.engine.scheduler_carry import as_made, carry_schedulers, rates_before
from workbench.engine.training_tensors import TrainingTensors, carry as carry_tensors
from workbench.engine.actions.cleanup import trim_c_heap
from workbench.engine.actions.sharded_snapshot import has_fsdp1
from workbench.engine.control_plane import RanksLost
from workbench.engine.dispatch import handles
from workbench.engine.fresh_iterators import fresh_iterator_notes
from workbench.protocol.events import Error, Rebuild, Rebuilt
from workbench.engine.actions.optimizer_settings import settings_of
from workbench.engine.hotswap.compiled import reset_compiled_code
from workbench.engine.hotswap.kept_objects import ran, run_slice
from workbench.engine.hotswap.loader_workers import running_iterators
from workbench.engine.hotswap.patches import RunInNamespace
from workbench.engine.hotswap.planner import ChangeSet
from workbench.engine.import_builders import built_again_note, built_by_old_code, plan_import_builders
from workbench.engine.init_skipping import settled_notes, skipping_init
from workbench.engine.memory.gc_freeze import collect_all
from workbench.engine.loader_places import carry_places
from workbench.engine.training_globals import carry_state, state_namespace
from workbench.engine.released_iterators import release_iterators
from workbench.engine.rebuild import (
    carry_optimizers_setup_did_not_make,
    carry_over,
    restarted_note,
    restore_globals,
)
from workbench.engine.run_state import REBUILD_RESUMES, RunState
from workbench.engine.setup_rebinds import copies, names_bound_by
from workbench.engine.state_walk import find_with_globals
from workbench.errors import UserError

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker

Statements = list[tuple[str, RunInNamespace]]  # (label, statement): what x runs in one file


@handles(Rebuild, needs_state=True, missing="nothing to rebuild", hint="fix it and save to run it again")
def rebuild(worker: TrainingWorker, command: Rebuild) -> None:
    """`activity` says so while it runs: setup() may take minutes, and a quit waits for it (headless's
    escalation never cuts it short) rather than lose the trained state it is carrying over."""
    worker.activity = "rebuilding: setup() runs again"
    try:
        _rebuild_now(worker)
    finally:
        worker.activity = None


class OtherRanksFailed(Exception):
    """This rank built its new state, another rank's setup() failed: every rank keeps its old state."""


def _agree(worker: TrainingWorker, error: str | None, carried: dict[str, Any] | None = None) -> list[str]:
    """Under torchrun: every rank's outcome, with what it carried (`carried_summary`); raises OtherRanksFailed if this
    rank succeeded and another did not. Rank 0's notes on any rank that carried otherwise than it (one collective for
    both: no other point of the rebuild where every rank must meet)."""
    if worker.lockstep is None:
        return []
    outcomes = worker.lockstep.plane.gather_json([error, carried])
    failed = [(rank, why) for rank, (why, _) in enumerate(outcomes) if why is not None]
    if failed and error is None:
        named = "; ".join(f"rank {rank}: {why}" for rank, why in failed)
        raise OtherRanksFailed(f"setup() failed on {named}")
    return differing_ranks_notes([summary for _, summary in outcomes]) if worker.lockstep.rank == 0 else []


def _rebuild_now(worker: TrainingWorker) -> None:
    started = time.monotonic()
    agreed = False  # under torchrun, whether this rank has given its outcome (exactly once per rebuild)
    held, worker._held = list(worker._held.values()), {}
    committed: list[ChangeSet] = []
    changed: list[str] = []
    namespaces = worker._namespaces()
    # The globals as they were: setup() re-binds `global model`; the old ones are carried from, or put back.
    before = copies(namespaces)
    rates = rates_before(worker.user_state, namespaces)  # a scheduler made again over the same optimizer resets them
    try:
        refuse_fsdp1(worker.user_state, namespaces)
        bound_by_held: list[tuple[int, str, list[str]]] = []  # (version, module, names) of each held change
        for changeset in held:
            version = worker.reloader.commit(changeset)
            committed.append(changeset)
            changed.extend(changeset.changed)
            if changeset.module is not None:
                bound_by_held.append((version, changeset.module.__name__, names_bound_by(changeset.patches)))
        # setup() reads the globals it re-bound as a fresh start's would: as it found them, or as the file now has them.
        skip = {(module, name) for _, module, names in bound_by_held for name in names}
        restored = worker.setup_rebinds.restore(namespaces, skip=skip)
        # The statements a save did not re-run (x's) come next, as at a fresh start's import: what is built reads them.
        statements_run, statement_notes = _run_what_x_would(worker, committed)
        # Initialization of what will be carried is wasted (and, on a GPU, a second model's worth of work):
        # recorded, not run, and run afterwards for what was not carried.
        with drawing_as_at_the_start(worker):
            with skipping_init() as init_log:
                built_at_import = _build_what_import_built(worker, committed)
                found = copies(namespaces)
                new_state = _call_setup(worker)
            new_made = as_made(new_state, namespaces)  # before anything is carried into them
            new_settings = settings_of(find_with_globals(new_state, namespaces)[1])
            reset_compiled_code()
            report = carry_over(worker.user_state, new_state, before, namespaces)
            init_log.replay(report.carried)  # what is new draws its initial weights here, as a resume's do
        notes = carry_optimizers_setup_did_not_make(worker.user_state, new_state, report, namespaces)
        schedulers_carried, schedule_notes = carry_schedulers(worker.user_state, new_state, before, namespaces, rates,
                                                              worker.schedules_as_made, new_made)
        notes.extend(schedule_notes)
        notes.extend(report.moved)
        notes.extend(settled_notes(init_log, "rebuild"))
        if report.restarted:
            notes.append(restarted_note(report.restarted))
        if report.garbage:
            notes.append(_garbage_note(report.garbage))
        if restored:
            notes.append(_restored_note(restored))
        notes.extend(statement_notes)
        notes.extend(built_at_import)
        agreed = True
        notes.extend(_agree(worker, None, carried_summary(
            report.tensors, report.shared, report.optimizer_states, schedulers_carried, report.new, report.mismatched,
            report.dropped, notes)))
    except RanksLost:
        raise  # another rank is gone: the worker ends this one (workbench/engine/worker.py)
    except Exception as exc:  # noqa: BLE001 - a failed rebuild leaves the old state and code running
        new_state = None
        others = isinstance(exc, OtherRanksFailed)
        if not agreed:
            agreed = True
            _agree(worker, f"{type(exc).__name__}: {exc}")
        for _ in committed:
            worker.reloader.undo_last_commit()
        restore_globals(namespaces, before)  # what a half-run setup() bound to module globals
        for changeset in held:
            worker.reloader.forget_prepared(changeset.path)
        worker._held = {c.path: c for c in held}
        file, line = (None, None) if others else worker._where(exc)
        if others:
            message = f"rebuild failed: {exc}; what the other ranks built was dropped, so every rank keeps its old state and code"
        else:
            kept = "every rank keeps its old state and code" if worker.lockstep else "the old state and code stay"
            message = f"rebuild failed: {exc if isinstance(exc, UserError) else f'{type(exc).__name__}: {exc}'}; {kept}"
        worker.bus.publish(Error(where="rebuild", message=message, file=file, line=line,
                                 traceback=None if others or isinstance(exc, UserError) else worker._format(exc)))
        traceback.clear_frames(exc.__traceback__)
        collect_all()  # the half-built new state (a rebuild that ran out of memory, say)
        worker.probe.empty_cache()
        worker.bus.publish(Rebuilt(ok=False, error=message, code_version=worker.reloader.version))
        return
    project_modules = frozenset(name for name, _ in worker._namespaces())
    places = carry_places(worker.user_state, new_state, project_modules, worker.step)  # before the old loaders end
    notes.extend(places.notes)
    try:
        notes.extend(fresh_iterator_notes(new_state, worker.step, [], worker._project_relative, places.placed,
                                          rebuild=True, reshuffled=places.reshuffled))
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; only the note is missing
        notes.append(f"the iterators the new setup() made were not looked at ({type(exc).__name__}: {exc})")
    made_by_setup = worker.training_globals.state_values(new_state, project_modules)
    tensors_as_made = TrainingTensors()  # the baseline is what setup() made, so what is carried stays training's
    tensors_as_made.mark(worker._namespaces() + state_namespace(new_state))  # as the worker's: no project objects
    try:
        notes.extend(carry_tensors(worker.training_tensors, worker.user_state, new_state,
                                   list(find_with_globals(worker.user_state, namespaces)[0].values())))
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; the tensors starting over is said
        notes.append(f"the state's tensors that training changed were not carried over ({type(exc).__name__}: {exc})")
    try:
        notes.extend(carry_state(worker.user_state, new_state, worker.training_globals, project_modules))
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; the values starting over is said
        notes.append(f"the state's plain values were not carried over ({type(exc).__name__}: {exc})")
    notes.extend(release_iterators(worker.user_state, new_state))
    notes.extend(_release_rebuilt_loaders(worker, before))
    notes.extend(_files_apart(worker, already=" ".join(notes)))
    worker.user_state = new_state
    worker._epoch_check = places.epoch_check  # the new loaders' sampler epochs, after the first step
    worker.schedules_as_made = new_made
    worker.optimizers_as_made = new_settings
    if worker.broken is not None and not worker.broken.renew_group:
        worker.broken = None  # a new state: what the old one could not do (an ended generator, a DDP reducer) is gone
    worker._state_built_at = worker.reloader.version
    for version, module, names in bound_by_held:
        worker.setup_rebinds.saved(version, module, names)
    worker.setup_rebinds.record(found, worker._namespaces())
    worker.training_globals.mark(worker._plain_value_namespaces(), made_by_setup)
    worker.training_tensors = tensors_as_made
    worker._state_bytes_estimate = None  # the new state's size, when next asked
    worker.eval_watch.refresh(new_state)
    del new_state
    for path, statements in statements_run.items():  # run above: nothing is left for x
        worker._statements.pop(path, None)
        worker.reloader.statements_ran(path)
        module = worker.project.modules().get(path)
        if module is not None:
            worker.setup_rebinds.saved(worker.reloader.version, module.__name__,
                                       names_bound_by(patch for _, patch in statements if ran(patch)))
    collect_all()  # the old state, frozen since setup: thawed, collected, and the new state frozen
    trim_c_heap()  # the old state's small CPU tensors came from the C heap: give its pages back (RSS falls)
    worker.probe.empty_cache()
    version = worker.reloader.version
    worker.telemetry.record_version(worker.step, version, ("rebuild", *changed))
    if not changed:  # same code, new state: still its own row in the versions table
        worker.telemetry.versions.start(version, ("rebuild",), worker.step, fresh_state=True)
    worker.bus.publish(
        Rebuilt(
            ok=True,
            seconds=time.monotonic() - started,
            code_version=version,
            changed=tuple(changed),
            tensors_carried=report.tensors,
            tensors_shared=report.shared,
            optimizer_states_carried=report.optimizer_states,
            schedulers_carried=schedulers_carried,
            new=tuple(report.new),
            mismatched=tuple(report.mismatched),
            dropped=tuple(report.dropped),
            notes=tuple(notes),
        )
    )
    worker._warn_of_uninitialized_parameters()  # what the new setup() made and nothing carried over
    if worker.state is RunState.PAUSED and worker.pause_reason in REBUILD_RESUMES:
        worker._resume("rebuild")


def _release_rebuilt_loaders(worker: TrainingWorker, before: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Shut down the workers of the loaders made at import that this rebuild made again (their workers ran old code):
    now, not whenever the old objects are collected."""
    notes: list[str] = []
    now = dict(worker._namespaces())
    for module_name, old_globals in before:
        for name in [name for m, name in worker.loaders_to_rebuild if m == module_name]:
            old, new = old_globals.get(name), now.get(module_name, {}).get(name)
            if old is not None and old is not new:
                notes.extend(release_iterators(old, new))  # generators closed, iterators among its values shut down
                kept = {id(each) for each in running_iterators(new, name)}
                for iterator in running_iterators(old, name):  # and those deeper or private (`loader._iterator`)
                    if id(iterator) not in kept:
                        try:
                            iterator._shutdown_workers()
                        except Exception as exc:  # noqa: BLE001 - the new state is in place already
                            notes.append(f"shutting down the old {name}'s workers raised {type(exc).__name__}: {exc}")
    worker.loaders_to_rebuild.clear()
    return notes


def _garbage_note(names: list[str]) -> str:
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"not carried over: {shown} held non-finite or absurdly large values (uninitialized memory, or a "
            "diverged run), so they hold what the new setup() made, and their optimizer state starts again")


def refuse_fsdp1(state: Any, namespaces: list[tuple[str, dict[str, Any]]]) -> None:
    """FSDP1's `state_dict()` hands out gathered copies, not its flat parameters: carried into them, the trained
    values would be dropped while the rebuild said they were carried. Said before setup() runs (on every rank alike)."""
    modules, _ = find_with_globals(state, namespaces)
    if has_fsdp1(modules.values()):
        raise UserError("a rebuild cannot carry the state of a model wrapped in FSDP1's FullyShardedDataParallel over "
                        "(its state_dict() gathers copies); wrap it with fully_shard (FSDP2) to rebuild in place, or "
                        "take a snapshot (s), quit, and start again with --resume latest")


def _restored_note(restored: list[str]) -> str:
    names = ", ".join(restored)
    return (f"setup() ran with {names} as it found them before it re-bound them last time (a fresh start's value; "
            "no statement of the file that binds them changed since)")


def _run_what_x_would(worker: TrainingWorker, committed: list[ChangeSet]) -> tuple[dict[Path, Statements], list[str]]:
    """Run the module statements that saves (and the held changes just committed) did not re-run, which x would run
    (`simple_llama2_config = ModelArgs(n_layers=3)`): a fresh start builds the model from the file as it is, so R,
    which builds it again, must read them too; before, R built the old config's model and said it built the new
    code's. Returns what ran, by file, and a note for each file. A failure raises: the rebuild fails, the old globals
    are put back and the statements stay for x."""
    pending = dict(worker._statements)
    pending.update({changeset.path: changeset.statements for changeset in committed if changeset.statements})
    notes: list[str] = []
    for path, statements in pending.items():
        with worker.project.as_script():
            run_slice(statements)
        labels = [label for label, patch in statements if ran(patch)]
        if labels:
            notes.append(f"ran first what the saves of {worker.project.relative(path)} had not re-run (x's statements), "
                         f"so what is built reads {_what_runs(worker, path)}: {'; '.join(labels)}")
    return pending, notes


def _files_apart(worker: TrainingWorker, already: str) -> list[str]:
    """A note naming the project files whose code that runs, which the rebuild built from, is not what the file on
    disk holds (a rollback since their save, a refused save, or a save not applied yet): R after adding a layer and
    rolling it back dropped the trained layer, and said nothing of why. None for a file the x-statements' note already
    names."""
    apart: dict[str, list[str]] = {}
    for path in worker.reloader.tracked_files():
        name = worker.project.relative(path)
        why = _why_apart(worker, path)
        if why is not None and f"the saves of {name} had not re-run" not in already:
            apart.setdefault(why, []).append(name)
    notes = []
    for why, names in apart.items():
        one = len(names) == 1
        files, it = ", ".join(names), ("it" if one else "them")
        if why == UNREAD:
            notes.append(f"built from the code that runs now, not the file{'' if one else 's'} on disk: {files} "
                         f"{'has a save' if one else 'have saves'} not applied yet (saved as the rebuild ran, its "
                         "reload comes next; with --no-watch, r applies it); R again after it to build with "
                         f"{'its' if one else 'their'} lines")
        else:
            notes.append(f"built from the code that runs now, not the file{'' if one else 's'} on disk: {files} "
                         f"{'differs' if one else 'differ'} (a rollback since {'its' if one else 'their'} save, or a "
                         f"save that was refused); save {it} to apply {'its' if one else 'their'} lines, and R again "
                         "to build with them")
    return notes


UNREAD = "a save not read yet"
APART = "a rollback or a refused save"


def _why_apart(worker: TrainingWorker, path: Path) -> str | None:
    """None when the code that runs is the file on disk; else why not: a save of it the reloader has not read yet
    (saved while R ran: its reload follows) or one it read and did not apply (a refused save, a rollback since)."""
    try:
        on_disk = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return APART
    if worker.reloader.applied_source(path) in (None, on_disk):
        return None
    return APART if worker.reloader.read_source(path) == on_disk else UNREAD


def _what_runs(worker: TrainingWorker, path: Path) -> str:
    """What R's statements were read from: the file, or the code that runs when a rollback (or a refused save, or a
    save not applied yet) left the two apart. A Forward-Forward port, rolled back after an argparse default's edit, was
    rebuilt from `default=2` while the note said it read the file, whose line says `default=1.5`."""
    why = _why_apart(worker, path)
    if why is None:
        return "the file as it is"
    if why == UNREAD:
        return ("the code that runs now, not the file on disk, which has a save not applied yet (its reload comes "
                "next; with --no-watch, r applies it)")
    return ("the code that runs now, not the file on disk, which differs (a rollback since its save, or a save that "
            "was refused): save the file to apply its lines")


def _build_what_import_built(worker: TrainingWorker, committed: list[ChangeSet]) -> list[str]:
    """Run again the module statements that built a live model or optimizer at import (import_builders.py), and those
    that made an instance of code the committed changes replace; a note for each file. A failure raises: the rebuild
    fails and the old globals are put back."""
    notes: list[str] = []
    changed_classes = tuple(cls for changeset in committed for cls in changeset.rebuild_if_live)
    modules = worker.project.modules()
    project_modules = frozenset(module.__name__ for module in modules.values())
    for path, module in modules.items():
        source = worker.reloader.applied_source(path)
        if source is None:
            continue
        also = built_by_old_code(module, changed_classes, project_modules) | frozenset(
            name for module_name, name in worker.loaders_to_rebuild if module_name == module.__name__)
        planned = plan_import_builders(module, source, path, also=also)
        if not planned:
            continue
        with worker.project.as_script():
            run_slice(planned)
        notes.append(built_again_note(worker.project.relative(path), [label for label, patch in planned if ran(patch)]))
    return notes


@contextlib.contextmanager
def drawing_as_at_the_start(worker: TrainingWorker) -> Iterator[None]:
    """setup(), and the initialization of what it made new, drawing from the random states the session's first
    setup() began with; training's own states put back after them, ran or failed (random_states.py). What setup()
    draws (a `random_split` of the data) is then a fresh start's, before its model or after it (init_skipping.py:
    the skipped initialization is made first); what it makes new is initialized after setup(), from where its
    draws left the states."""
    training = random_states.capture()
    if worker.random_before_setup is not None:
        random_states.restore(worker.random_before_setup)
    try:
        yield
    finally:
        random_states.restore(training)


def _call_setup(worker: TrainingWorker) -> Any:
    setup = worker.project.function("setup")
    if setup is None:
        raise NameError("setup(bench) is not defined in the project file")
    return setup(worker.bench)
