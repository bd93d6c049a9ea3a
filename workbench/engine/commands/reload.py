"""Commands that change which code is live: a saved file's prepared change, a rollback, held statements.

Each ends, when code changed, in `TrainingWorker._after_code_change`: the loop decides whether a
failed setup() runs again or a pause for an error ends.
"""

from __future__ import annotations

import functools
import re
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.engine.dispatch import handles
from workbench.protocol.events import Command, Error, Reload, Rollback, RunStatements
from workbench.engine.hotswap.compiled import reset_compiled_code
from workbench.engine.hotswap.construction import (
    built_from_note,
    called_by_setup_note,
    constants_read_when_built,
    constructor_read_note,
)
from workbench.engine.hotswap.loader_workers import LoaderRoot, worker_notes
from workbench.engine.import_builders import builders_by_name
from workbench.engine.hotswap.kept_objects import RunUnlessSameInputs, freeze, ran, run_slice, same_frozen
from workbench.engine.hotswap.patches import RunInNamespace
from workbench.engine.hotswap.planner import ChangeSet, ReloadError
from workbench.engine.hotswap.reloader import AppliedVersion
from workbench.engine.hotswap.scopes import line_numbers
from workbench.engine.hotswap.service import SourceUnchanged
from workbench.engine.setup_rebinds import names_bound_by
from workbench.engine.state_walk import NOT_STATE, find_instances, top_values

if TYPE_CHECKING:
    from workbench.engine.worker import TrainingWorker

MAX_VERSIONS_REMEMBERED = 256  # saves whose running loader iterators are kept (weakly) for their rollback


@dataclass(frozen=True)
class ApplyChanges(Command):
    """Internal: a prepared reload (or word that a file holds the live code), handled at the next step boundary."""

    changeset: ChangeSet | SourceUnchanged


@handles(ApplyChanges)
def apply_changes(worker: TrainingWorker, command: ApplyChanges) -> None:
    changeset = command.changeset
    if isinstance(changeset, SourceUnchanged):
        _source_unchanged(worker, changeset)
        return
    relative = worker.project.relative(changeset.path)
    try:
        worker.reloader.refresh(changeset)  # decide on what would really be applied now
    except ReloadError as exc:
        worker.bus.publish(Reload(ok=False, file=relative, error=exc.message, line=exc.line, code_version=worker.reloader.version))
        return
    reasons = _reasons_with_live_instances(
        worker, changeset.needs_rebuild, changeset.rebuild_if_live.items(), "live instances built by the old code"
    )
    if changeset.module is not None:
        reasons += [
            f"setup() re-binds {name} (`global {name}`): the value it makes from the new one comes with setup(), "
            "not with the saved statement alone"
            for name in worker.setup_rebinds.rebound_by_setup(changeset.module.__name__, names_bound_by(changeset.patches))
        ]
    if reasons and worker.user_state is not None:
        # Applying would leave live objects built by old code running new code: hold it back.
        held_along = _held_along(changeset, reasons)
        worker._held[changeset.path] = changeset
        worker.reloader.forget_prepared(changeset.path)
        worker.bus.publish(
            Reload(
                ok=True,
                file=relative,
                ms=(time.monotonic() - changeset.detected_at) * 1000,
                code_version=worker.reloader.version,
                held=tuple(changeset.changed),
                needs_rebuild=tuple(reasons),
                notes=(
                    (
                        "held back: press R (command `rebuild`) to build again with the new code (setup(), and the "
                        "models and optimizers the files build at import), carrying weights and optimizer state over, "
                        "or keep going on the old code"
                    ),
                    *held_along,
                    *changeset.notes,
                ),
            )
        )
        return
    worker._held.pop(changeset.path, None)
    try:
        version = worker.reloader.commit(changeset, roots=[("state", worker.user_state)])
    except ReloadError as exc:
        worker.bus.publish(Reload(ok=False, file=relative, error=exc.message, line=exc.line, code_version=worker.reloader.version))
        return
    except Exception as exc:  # noqa: BLE001 - a patch that fails is undone; training goes on
        worker.bus.publish(
            Reload(
                ok=False,
                file=relative,
                error=f"applying the change failed ({type(exc).__name__}: {exc}); nothing was changed",
                code_version=worker.reloader.version,
            )
        )
        return
    if changeset.module is not None:
        worker.setup_rebinds.saved(version, changeset.module.__name__, names_bound_by(changeset.patches))
    notes = list(changeset.notes)
    if changeset.statements:
        worker._statements[changeset.path] = changeset.statements
    else:
        worker._statements.pop(changeset.path, None)
    if changeset.changed:
        worker.telemetry.record_version(worker.step, version, tuple(changeset.changed))
        if reset_compiled_code():
            notes.append("torch.compile caches were reset: compiled code recompiles on its next call")
        if changeset.module is not None:
            notes.extend(_worker_notes(worker, changeset.changed, changeset.module, version))
        notes.extend(_reasons_with_live_instances(worker, (), changeset.note_if_live.items(), "live instances"))
        notes.extend(changeset.built_from_notes())
    worker.bus.publish(
        Reload(
            ok=True,
            file=relative,
            changed=tuple(changeset.changed),
            ms=(time.monotonic() - changeset.detected_at) * 1000,
            code_version=version,
            notes=tuple(notes),
        )
    )
    if changeset.changed:
        worker._after_code_change()


def _source_unchanged(worker: TrainingWorker, unchanged: SourceUnchanged) -> None:
    """The file is back to the live code: a change held for rebuild is dropped, and the user told."""
    relative = worker.project.relative(unchanged.path)
    ms = (time.monotonic() - unchanged.detected_at) * 1000
    if worker._held.pop(unchanged.path, None) is not None:
        note = "the file is back to the live code: the change held for a rebuild is dropped (nothing is held)"
        worker.bus.publish(Reload(ok=True, file=relative, ms=ms, code_version=worker.reloader.version, notes=(note,)))
    elif not unchanged.manual:
        worker.bus.publish(Reload(ok=True, file=relative, ms=ms, code_version=worker.reloader.version, notes=("no code changes",)))


@handles(RunStatements)
def run_statements(worker: TrainingWorker, command: RunStatements) -> None:
    """Run the changed module statements that a reload did not re-run, because the user asked."""
    if not worker._statements:
        if any(c.statements for c in worker._held.values()):
            worker._command_error(
                "the edited module statements are part of a change held for a rebuild: press R (command `rebuild`), "
                "which applies it and runs them before it builds"
            )
        else:
            worker._command_error("no held-back module statements to run")
        return
    ran_any = False
    for path, statements in list(worker._statements.items()):
        bound = {name for _, patch in statements for name in patch.binds}
        namespace = statements[0][1].namespace if statements else {}
        before = {name: freeze(namespace.get(name)) for name in bound}
        try:
            with worker.project.as_script():
                run_slice(statements)
        except Exception as exc:  # noqa: BLE001 - undone by run_slice (all or nothing); the old values stay
            file, line = worker._where(exc)
            worker.bus.publish(
                Error(where="reload", message=f"running the statements failed: {type(exc).__name__}: {exc}; "
                      "nothing was changed", file=file, line=line, traceback=worker._format(exc))
            )
            traceback.clear_frames(exc.__traceback__)
            continue
        del worker._statements[path]
        worker.reloader.statements_ran(path)
        module = worker.project.modules().get(path)
        if module is not None:
            worker.setup_rebinds.saved(worker.reloader.version, module.__name__,
                                       names_bound_by(patch for _, patch in statements if ran(patch)))
        worker.bus.publish(
            Reload(
                ok=True,
                file=worker.project.relative(path),
                changed=tuple(name for _, patch in statements if ran(patch) for name in patch.binds),
                code_version=worker.reloader.version,
                notes=(*_ran_notes(statements), *_built_from_what_x_changed(worker, namespace, before)),
            )
        )
        ran_any = True
    if ran_any:
        worker._after_code_change()  # like a saved fix: a pause for an error ends, a failed setup() runs again


def _built_from_what_x_changed(worker: TrainingWorker, namespace: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """The globals x gave a new value that setup() read when it built the live state (`opt`, whose `opt.lr` the
    optimizer was made with): what it built keeps the old value until R, as for a constant a save re-binds."""
    setup = worker.reloader.entry_setup()
    if getattr(setup, "__globals__", None) is not namespace:
        return []  # x ran another module's statements: setup() reads its own module's globals
    changed = [name for name, was in before.items() if not same_frozen(was, freeze(namespace.get(name)))]
    read = constants_read_when_built(namespace, changed, setup)
    return [built_from_note(name, chains) for name, chains in read.items()]


def _ran_notes(statements: list[tuple[str, RunInNamespace]]) -> tuple[str, ...]:
    """What x did, line by line, but in one note each: the lines run because the same inputs changed (every
    `parser.add_argument` after a new parser), and the plain lines it left alone (nothing they read changed)."""
    entries: list[str | tuple[str, ...]] = []  # a note, or the inputs whose change ran the lines grouped under it
    grouped: dict[tuple[str, ...], list[str]] = {}
    left: list[str] = []
    for label, patch in statements:
        if not isinstance(patch, RunUnlessSameInputs):
            entries.append(f"ran {label}")
        elif patch.ran:
            reason = tuple(patch.changed)
            if reason not in grouped:
                grouped[reason] = []
                entries.append(reason)
            grouped[reason].append(label.removeprefix("line "))
        elif (outcome := patch.outcome(label)) is not None:
            entries.append(outcome)
        else:
            left.append(label.removeprefix("line "))
    notes = [
        entry if isinstance(entry, str)
        else f"ran line{'s' if len(grouped[entry]) > 1 else ''} {_lines(grouped[entry])}, as {', '.join(entry)} changed"
        for entry in entries
    ]
    if left:
        notes.append(f"left as they were, since nothing they read changed: line(s) {_lines(left)}")
    return tuple(notes)


def _lines(labels: list[str]) -> str:
    """A few lines with their text (57 with its `torch.manual_seed(args.seed)`); many by number only, for the log."""
    if len(labels) <= 3:
        return "; ".join(labels)
    return line_numbers(int(label.split(":", 1)[0]) for label in labels)


@handles(Rollback)
def rollback(worker: TrainingWorker, command: Rollback) -> None:
    try:
        undone, version = worker.reloader.rollback(roots=[("state", worker.user_state)])
    except ReloadError as exc:
        worker._command_error(exc.message)
        return
    worker._held.pop(undone.path, None)
    ran_since = _statements_ran_since(worker, undone)
    for path in dict.fromkeys([undone.path, *(folded for folded, _, _ in undone.folded)]):
        _statements_after_rollback(worker, path)
    worker.telemetry.record_version(worker.step, version, (f"rollback of v{undone.version}",))
    reset_compiled_code()
    notes = [
        (
            f"rolled back version {undone.version}: the code before it runs again; "
            "the file on disk still has the newer code (save it again to re-apply)"
        ),
        *undone.notes,
        *ran_since,
    ]
    module = worker.project.modules().get(undone.path)
    if module is not None:
        worker.setup_rebinds.rolled_back(undone.version, module.__name__, names_bound_by(undone.patches))
        notes.extend(_worker_notes(worker, undone.changed, module, undone.version, rollback=True))
    if undone.version <= worker._state_built_at:  # setup() ran since this version: it built with its values
        notes.extend(built_from_note(name, chains, rolled_back=True) for name, chains in undone.built_from)
        notes.extend(called_by_setup_note(name, chain, rolled_back=True) for name, chain in undone.setup_calls)
        notes.extend(_reasons_with_live_instances(worker, (), _constructors_rebuilt(undone), "live instances"))
    built_by_newer = _rolled_back_rebuild_reasons(worker, undone)
    if built_by_newer:
        notes.append(
            "the live state was built by the rolled-back code, so it keeps its shape until R (command `rebuild`) "
            f"runs setup() again with the code before it: {'; '.join(built_by_newer)}"
        )
    worker.bus.publish(
        Reload(
            ok=True,
            file=worker.project.relative(undone.path),
            changed=undone.changed,
            code_version=version,
            needs_rebuild=tuple(built_by_newer),
            notes=tuple(notes),
        )
    )
    worker._after_code_change()


def _statements_ran_since(worker: TrainingWorker, undone: AppliedVersion) -> list[str]:
    """The module statements the undone version left for x that x or a rebuild has run since: what they made came
    from the rolled-back code (`optimizer = make_optimizer(...)` with its new betas), so they are left for x again,
    as the code before has them, and said."""
    ran_at = worker.reloader.statements_ran_at
    labels = [label for path, names, commit in ((undone.path, undone.named_binds, undone.commit), *undone.folded)
              if ran_at >= commit for label in worker.reloader.leave_for_x(path, names)]
    if not labels:
        return []
    return [f"{'; '.join(labels)} ran with the rolled-back code since (x or R ran it): what it made keeps that "
            "code's result, so it is left for x again, to run as the code before has it (press x; R runs it too, "
            "before it builds, and a line that would replace a live model or optimizer is R's)"]


def _statements_after_rollback(worker: TrainingWorker, path: Path) -> None:
    """What x runs now: the statements left for it that the code before the undone version still holds, planned
    against that code. The undone save's own (`config = Args(3)`) are gone with it; x ran them compiled from the
    undone text before."""
    statements = worker.reloader.statements_not_rerun(path)
    if statements:
        worker._statements[path] = statements
    else:
        worker._statements.pop(path, None)


def _constructors_rebuilt(undone: AppliedVersion) -> list[tuple[type, str]]:
    """Each class whose constructor read a constant of the undone version, with what to say of its instances: a
    rebuild since built them with the rolled-back value (`MLP()` at import with `n_layer = 1`), which they keep."""
    return [(cls, constructor_read_note(cls.__name__, names, rolled_back=True)) for cls, names in undone.constructor_reads]


def _rolled_back_rebuild_reasons(worker: TrainingWorker, undone: AppliedVersion) -> list[str]:
    """What of the undone version shaped the live state: its setup() or constructors, applied by a rebuild."""
    if worker.user_state is None:
        return []
    return _reasons_with_live_instances(
        worker, undone.needs_rebuild, undone.rebuild_if_live, "live instances built by the rolled-back code"
    )


_REASON_SUBJECT = re.compile(r"^(?:class (?P<cls>\S+) \(line|setup\(\) re-binds (?P<bound>\S+)|(?P<name>\S+?)(?:\(\))? "
                             r"(?:changed|was removed))")


def _held_along(changeset: ChangeSet, reasons: list[str]) -> list[str]:
    """A file's save is held whole: the names it changed that need no rebuild themselves are held for the others'
    reasons; say so, or they look held for none (minGPT, ported: an edited `NewGELU.forward` held behind
    `Block.__init__`, which a save before it had changed)."""
    needing: list[str] = []
    for reason in reasons:
        match = _REASON_SUBJECT.match(reason)
        if match is not None:
            needing.append(match.group("cls") or match.group("bound") or match.group("name"))
    if not needing:
        return []
    alone = [name for name in changeset.changed
             if name not in needing and not any(name.startswith(f"{whole}.") for whole in needing)]
    if not alone:
        return []
    return [f"{', '.join(alone)} held with {', '.join(needing)}, which "
            f"{'needs' if len(needing) == 1 else 'need'} a rebuild: a file's changes are applied together; press R, "
            f"or save {'that change' if len(needing) == 1 else 'those changes'} back to apply the rest"]


def _reasons_with_live_instances(
    worker: TrainingWorker, always: Iterable[str], if_live: Iterable[tuple[type, str]], instances_are: str
) -> list[str]:
    """The reasons to rebuild: `always`, and each class's reason where the state holds instances of it."""
    reasons = list(always)
    namespaces = worker._namespaces()
    for cls, why in if_live:
        if any(reason.startswith(why) for reason in reasons):
            continue  # the class and the one a reload made again in its place: said once
        instances = find_instances(worker.user_state, cls, namespaces=namespaces) if worker.user_state is not None else []
        if instances:
            shown = ", ".join(instances[:5]) + (f" and {len(instances) - 5} more" if len(instances) > 5 else "")
            reasons.append(f"{why}; {instances_are}: {shown}")
    return reasons


def _worker_notes(worker: TrainingWorker, changed: Iterable[str], module: types.ModuleType, version: int,
                  rollback: bool = False) -> list[str]:
    """What the loaders' worker processes keep of the old code; the globals made at import that hold them are R's to
    make again from then on. A save records the iterators already running (their workers have the code before it);
    its rollback leaves them out, since that code is live again, and takes back what it asked R to make again.
    Runs on the training thread after the change is applied, through whatever the project keeps in its globals: a walk
    that fails (an object that raises when looked at) costs this note, never the session or the reload's event."""
    change = "this rollback" if rollback else "this save"
    before, asked = worker.workers_at_version.pop(version, ((), set())) if rollback else ((), set())
    try:
        found = worker_notes(_loader_roots(worker), changed, module, change, running_before=before)
    except Exception as exc:  # noqa: BLE001 - the change is applied: its event must still be published
        return [f"could not tell whether DataLoader workers still run the code before {change} "
                f"({type(exc).__name__}: {exc}); a worker process started earlier keeps the code it started with"]
    worker.loaders_to_rebuild.difference_update(asked)
    if not rollback:
        worker.workers_at_version[version] = (weakref.WeakSet(found.running), set(found.rebuild) - worker.loaders_to_rebuild)
        for old in sorted(worker.workers_at_version)[:-MAX_VERSIONS_REMEMBERED]:
            del worker.workers_at_version[old]
    worker.loaders_to_rebuild.update(found.rebuild)
    return found.notes


def _builder_named(builders: Callable[[], dict[str, str]], name: str) -> str | None:
    return builders().get(name)


def _loader_roots(worker: TrainingWorker) -> list[LoaderRoot]:
    """Where DataLoaders live: the state, and module globals of script-style trainers (`train_loader = ...`, an
    object holding one); each says whether a rebuild's setup() makes it again, or which statement made it at import."""
    roots = [LoaderRoot(path, value, remade_by_rebuild=True) for path, value in top_values(worker.user_state)]
    for path, module in worker.project.modules().items():
        source = worker.reloader.applied_source(path)
        # Parsed the first time a global of this file holds loader workers (most saves: never), then kept.
        builders = functools.cache(functools.partial(builders_by_name, source, path) if source is not None else dict)
        module_name, namespace = module.__name__, vars(module)
        for name, value in list(namespace.items()):
            if name.startswith("__") or isinstance(value, NOT_STATE):
                continue
            by_setup = worker.setup_rebinds.bound_by_setup(module_name, name)
            roots.append(LoaderRoot(f"{module_name}.{name}", value, by_setup, (module_name, name),
                                    None if by_setup else functools.partial(_builder_named, builders, name)))
    return roots
