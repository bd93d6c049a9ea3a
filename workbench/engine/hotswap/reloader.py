"""Code versions: what source is live for each file, and the history to roll back through.

`prepare` runs on the reload thread; `commit` and `rollback` run on the
training thread. The small bookkeeping they share is guarded by a lock.

Each applied version keeps its patches, and a patch remembers what it
replaced, so a rollback restores exactly the objects it changed. The history is
bounded (`max_history`): older versions are forgotten, and with them the old
code objects they hold.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engine.hotswap.deleted_names import RemoveDeleted
from workbench.engine.hotswap.live_objects import UpdateLiveCopies
from workbench.engine.hotswap.patches import Patch, RunInNamespace, apply_all, undo_all
from workbench.engine.hotswap.planner import ChangeSet, ReloadError, plan_not_rerun, plan_reload
from workbench.engine.hotswap.source_index import SourceIndex
from workbench.engine.hotswap.statement_slice import DEFINITIONS, bound_names, line_label, statement_text
from workbench.engine.hotswap.syntax_trees import parse
from workbench.engine.project import IMPORTED_SOURCES, Project, read_source

DEFAULT_MAX_HISTORY = 50


@dataclass(frozen=True)
class AppliedVersion:
    version: int
    path: Path
    changed: tuple[str, ...]
    previous_source: str
    source: str
    applied_at: float
    patches: tuple[Patch, ...] = field(repr=False, default=())
    # What made this version need a rebuild, if anything: rolling it back after a rebuild leaves
    # live objects built by its code (the worker names them in the rollback's event).
    needs_rebuild: tuple[str, ...] = ()
    rebuild_if_live: tuple[tuple[type, str], ...] = field(repr=False, default=())
    # Re-bound constants setup() read when it built the state: a state built since keeps this version's values.
    built_from: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Changed functions setup() called, with how: a state built since keeps what this version's code made.
    setup_calls: tuple[tuple[str, str], ...] = ()
    notes: list[str] = field(repr=False, default_factory=list)  # what the last undo could not give back
    named_binds: frozenset[str] = frozenset()  # names its not-re-run module statements bind (ChangeSet.named_binds)
    constructor_reads: tuple[tuple[type, tuple[str, ...]], ...] = field(repr=False, default=())  # ChangeSet's
    # After a rollback: the versions folded into it (line-number updates, saves that only left statements for x),
    # each file with the names its not-re-run statements bind.
    folded: tuple[tuple[Path, frozenset[str], int], ...] = ()
    commit: int = 0  # Reloader.commits when it was applied


class Reloader:
    """Turns saved files into change sets and applies them, keeping a bounded history of versions."""

    def __init__(self, project: Project, required: dict[str, tuple[str, ...]], max_history: int = DEFAULT_MAX_HISTORY) -> None:
        self.project = project
        self.required = required
        self.version = 0
        self.commits = 0  # every commit counted, code version or not: what ran after what
        self.statements_ran_at = 0  # `commits` when x or a rebuild last ran the statements left for x
        self._applied: dict[Path, str] = {}
        self._prepared: dict[Path, str] = {}
        self._read: dict[Path, str] = {}  # each file's text as the last save of it was read, planned or refused
        self._history: deque[AppliedVersion] = deque(maxlen=max(max_history, 1))
        self._indexes: dict[Path, dict[str, SourceIndex]] = {}  # statement positions of applied/prepared sources
        # Module statements left for x in each file's live code (`statement_text`), until x or a rebuild runs them.
        self._not_rerun: dict[Path, frozenset[str]] = {}
        self._lock = threading.Lock()

    def track_loaded_modules(self) -> None:
        """Remember the source of every project module imported so far (the diff base)."""
        for path in self.project.modules():
            with self._lock:
                if path in self._applied:
                    continue
            source = IMPORTED_SOURCES.get(path)  # what was imported, even if saved over since
            if source is None:
                try:
                    source = read_source(path)
                except (OSError, UnicodeDecodeError, SyntaxError):
                    continue
            with self._lock:
                self._applied.setdefault(path, source)

    def warm_up(self) -> None:
        """Index every tracked file now (off the training thread), so the first save parses only its edit."""
        for path in self.tracked_files():
            source = self.applied_source(path)
            if source is not None:
                try:
                    self._index(path, source)
                except SyntaxError:
                    pass

    def _index(self, path: Path, source: str) -> SourceIndex:
        with self._lock:
            cached = self._indexes.get(path, {}).get(source)
        if cached is not None:
            return cached
        index = SourceIndex.parse(source, str(path))
        self._remember_index(path, index)
        return index

    def _remember_index(self, path: Path, index: SourceIndex) -> None:
        with self._lock:
            keep = {self._applied.get(path), self._prepared.get(path), index.source}
            self._indexes[path] = {src: i for src, i in self._indexes.get(path, {}).items() if src in keep}
            self._indexes[path][index.source] = index

    @property
    def history(self) -> list[AppliedVersion]:
        with self._lock:
            return list(self._history)

    def tracked_files(self) -> list[Path]:
        self.track_loaded_modules()
        with self._lock:
            return sorted(self._applied)

    def applied_source(self, path: Path) -> str | None:
        with self._lock:
            return self._applied.get(path)

    def read_source(self, path: Path) -> str | None:
        """The text of `path` as its last save was read (applied, refused or rolled back since); None before one: a
        file on disk unlike both this and the applied source holds a save not read yet (its reload is on its way)."""
        with self._lock:
            return self._read.get(path.resolve())

    def prepare(self, path: Path, detected_at: float | None = None, source: str | None = None,
                announce: Callable[[Path, str], None] | None = None) -> ChangeSet | None:
        """Plan the patches for a saved file; None when its code did not change.

        `source`: the file's text as another rank read it (distributed runs plan from rank 0's bytes, not
        from this node's disk, which may lag behind on a shared filesystem). `announce`: told the source read
        before planning starts (rank 0 posts it, so the other ranks plan it meanwhile)."""
        self.track_loaded_modules()
        path = path.resolve()
        module = self.project.modules().get(path)
        with self._lock:
            base = self._prepared.get(path, self._applied.get(path))
            not_rerun = self._not_rerun.get(path, frozenset())
        if module is None or base is None:
            if not path.exists():
                return None
            return ChangeSet(
                path=path,
                module=None,
                base_source="",
                new_source="",
                notes=[f"{self.project.relative(path)} is not imported by the session: nothing to patch"],
                detected_at=detected_at or time.monotonic(),
            )
        try:
            if source is None:
                source = read_source(path)
        except FileNotFoundError:
            missing = ReloadError(f"{path.name} was deleted; the old code keeps running. Restore the file to go on.")
            missing.source = ""  # editors that save by rename delete the file for a moment
            raise missing from None
        except (OSError, UnicodeDecodeError, SyntaxError) as exc:
            raise ReloadError(f"cannot read {path.name}: {exc}") from None
        with self._lock:
            self._read[path] = source
        if source == base:
            return None
        if announce is not None:
            announce(path, source)
        try:
            changeset = plan_reload(
                module,
                path,
                self._index(path, base),
                source,
                required=self._required_for(path),
                other_namespaces=self._others(path),
                setup=self.entry_setup(),
                not_rerun=not_rerun,
            )
        except ReloadError as exc:
            exc.source = source
            raise
        finally:
            # Planning runs the file's imports: a module it imported for the first time is tracked
            # now, before the user can edit it, so its first edit has a base to diff against.
            self.track_loaded_modules()
        changeset.detected_at = detected_at or time.monotonic()
        with self._lock:
            self._prepared[path] = source
        if changeset.index is not None:
            self._remember_index(path, changeset.index)
        return changeset

    def commit(self, changeset: ChangeSet, roots: list[Any] | None = None) -> int:
        """Apply on the training thread; all or nothing. Returns the code version now live.

        `roots` (the session state) is where closures and generators holding old code are looked for.
        """
        path = changeset.path
        if changeset.module is None:
            return self.version
        self.refresh(changeset)
        walkers = [p for p in changeset.patches if isinstance(p, (UpdateLiveCopies, RemoveDeleted))]
        for patch in walkers:
            patch.roots = [*(roots or []), *((f"module {m.__name__}", m.__dict__) for m in self.project.modules().values())]
        try:
            apply_all(changeset.patches)
        except BaseException:
            self.forget_prepared(path)
            raise
        for patch in walkers:
            changeset.notes.extend(patch.notes)
            patch.roots = []  # do not keep the state alive from the history
            if isinstance(patch, RemoveDeleted):  # what it removed is decided now, against the live objects
                changeset.changed.extend(f"{name} (removed)" for name in patch.removed)
        with self._lock:
            previous = self._applied.get(path, "")
            self._applied[path] = changeset.new_source
            show_lines_of(path, changeset.new_source)
            self._not_rerun[path] = changeset.not_rerun
            self.commits += 1
            self._prepared[path] = changeset.new_source
            # A save that only left statements for x is kept too (not a code version): a rollback folds it with the
            # version before it, and must know what its statements bind once x or R has run them.
            if changeset.changed or changeset.patches or changeset.named_binds:
                if changeset.changed:
                    self.version += 1
                self._history.append(
                    AppliedVersion(
                        self.version,
                        path,
                        tuple(changeset.changed),
                        previous,
                        changeset.new_source,
                        time.time(),
                        tuple(changeset.patches),
                        tuple(changeset.needs_rebuild),
                        _classes_old_and_new(changeset),
                        tuple((name, tuple(chains)) for name, chains in changeset.built_from.items()),
                        tuple(changeset.setup_calls.items()),
                        named_binds=changeset.named_binds,
                        constructor_reads=tuple(changeset.constructor_reads.items()),
                        commit=self.commits,
                    )
                )
            return self.version

    def refresh(self, changeset: ChangeSet) -> None:
        """Plan again from what is live if the file's live code changed since this was planned
        (a change held back or failed, a rollback): decide and apply on the fresh plan."""
        if changeset.module is None:
            return
        path = changeset.path
        with self._lock:
            applied = self._applied.get(path)
            not_rerun = self._not_rerun.get(path, frozenset())
        if applied is None or applied == changeset.base_source:
            return
        fresh = plan_reload(
            changeset.module,
            path,
            self._index(path, applied),
            changeset.new_source,
            required=self._required_for(path),
            other_namespaces=self._others(path),
            setup=self.entry_setup(),
            not_rerun=not_rerun,
        )
        changeset.patches, changeset.changed, changeset.notes = fresh.patches, fresh.changed, fresh.notes
        changeset.needs_rebuild, changeset.rebuild_if_live = fresh.needs_rebuild, fresh.rebuild_if_live
        changeset.note_if_live, changeset.built_from = fresh.note_if_live, fresh.built_from
        changeset.constructor_reads = fresh.constructor_reads
        changeset.setup_calls = fresh.setup_calls
        changeset.statements, changeset.base_source, changeset.index = fresh.statements, applied, fresh.index
        changeset.not_rerun = fresh.not_rerun

    def rollback(self, roots: list[Any] | None = None) -> tuple[AppliedVersion, int]:
        """Undo the last applied version (training thread). Versions only count up: the result is a new one.

        `roots` (the session state): live closures made from the undone code since it was applied
        (a rebuild's setup() made them) get the code before it too; the version's `notes` say what could not.
        """
        folded_notes: list[str] = []
        folded_binds: list[tuple[Path, frozenset[str], int]] = []
        with self._lock:
            if not any(version.changed for version in self._history):
                # Checked before folding: "nothing to roll back" must leave the line numbers as they are too.
                raise ReloadError("nothing to roll back: no applied reload is left in the history")
            target = max(i for i, version in enumerate(self._history) if version.changed)
            path = self._history[target].path
            # The saves of the same file after it that changed no code (line numbers only, or lines left for x) are
            # folded into its rollback: the file goes back past them. Another file's stay as they are.
            for i in range(len(self._history) - 1, target, -1):
                if self._history[i].path != path:
                    continue
                folded = self._history[i]
                del self._history[i]  # a deque: no pop(i)
                self._undo_patches(folded, roots)
                folded_notes.extend(folded.notes)
                folded_binds.append((folded.path, folded.named_binds, folded.commit))
                self._applied[folded.path] = self._prepared[folded.path] = folded.previous_source
                show_lines_of(folded.path, folded.previous_source)
        last = self._undo_at(target, roots)
        last.notes[:0] = folded_notes
        if folded_binds:
            last = dataclasses.replace(last, folded=tuple(folded_binds))
        with self._lock:
            self.version += 1
            return last, self.version

    def undo_last_commit(self) -> None:
        """Take back a commit that never ran a step (a rebuild whose setup() failed)."""
        last = self._undo_last()
        if last.changed:
            with self._lock:
                self.version = last.version - 1

    def _undo_last(self, roots: list[Any] | None = None) -> AppliedVersion:
        return self._undo_at(-1, roots)

    def _undo_at(self, index: int, roots: list[Any] | None = None) -> AppliedVersion:
        with self._lock:
            last = self._history[index]
            del self._history[index]
        self._undo_patches(last, roots)
        with self._lock:
            self._applied[last.path] = last.previous_source
            self._prepared[last.path] = last.previous_source
            show_lines_of(last.path, last.previous_source)
        return last

    def _undo_patches(self, version: AppliedVersion, roots: list[Any] | None) -> None:
        walkers = [p for p in version.patches if isinstance(p, (UpdateLiveCopies, RemoveDeleted))]
        if roots is not None:
            for patch in walkers:
                patch.roots = [*roots, *((f"module {m.__name__}", m.__dict__) for m in self.project.modules().values())]
        try:
            undo_all(list(version.patches))
        finally:
            for patch in walkers:
                version.notes.extend(patch.notes)
                patch.roots = []

    def _others(self, path: Path) -> list[dict]:
        """The namespaces of the project's other modules (where `from x import y` copies live)."""
        return [module.__dict__ for other, module in self.project.modules().items() if other != path]

    def entry_setup(self) -> Any:
        """The live setup(): a save's changed functions that it calls are named (what it built keeps their old code)."""
        return getattr(self.project.modules().get(self.project.entry), "setup", None)

    def _required_for(self, path: Path) -> dict[str, tuple[str, ...]] | None:
        return self.required if path == self.project.entry else None

    def statements_ran(self, path: Path) -> None:
        """x or a rebuild ran the statements left for x in this file: none is left."""
        with self._lock:
            self._not_rerun.pop(path, None)
            self.statements_ran_at = self.commits

    def leave_for_x(self, path: Path, names: frozenset[str]) -> list[str]:
        """After a rollback of a version whose not-re-run statements x or a rebuild has run since: leave for x the
        statements of the live code that bind those names (`config = Args(2)` where the undone version had
        `Args(3)`), which a fresh start of it runs. Returns their labels."""
        if not names:
            return []
        source, statements = self._live_statements(path)
        found = [node for node in statements if bound_names(node) & names]
        with self._lock:
            self._not_rerun[path] = self._not_rerun.get(path, frozenset()) | {statement_text(n) for n in found}
        return [line_label(node, source) for node in found]

    def statements_left_for_x(self, path: Path) -> list[str]:
        """The labels (`line 9: ...`) of the statements of the live code a save left for x: what a snapshot records
        its run had not re-run (code_on_record.py). Reads only; an empty list for a file with none."""
        with self._lock:
            not_rerun = self._not_rerun.get(path, frozenset())
        if not not_rerun:
            return []
        source, statements = self._live_statements(path)
        return [line_label(node, source) for node in statements if statement_text(node) in not_rerun]

    def _live_statements(self, path: Path) -> tuple[str, list[ast.stmt]]:
        """The live code of a file and its top-level statements other than definitions (none when it has no live
        code, or it does not parse)."""
        with self._lock:
            source = self._applied.get(path)
        if source is None:
            return "", []
        try:
            body = parse(source, str(path)).body
        except SyntaxError:
            return source, []
        return source, [node for node in body if not isinstance(node, DEFINITIONS)]

    def statements_not_rerun(self, path: Path) -> list[tuple[str, RunInNamespace]]:
        """What x runs in this file's live code (after a rollback): the statements left for it that the code still
        holds; those the rollback took out are forgotten, since the value their old line made is the live one."""
        module = self.project.modules().get(path)
        with self._lock:
            source, not_rerun = self._applied.get(path), self._not_rerun.get(path, frozenset())
        if module is None or source is None:
            return []
        run, still = plan_not_rerun(module, path, source, not_rerun, self._others(path))
        with self._lock:
            self._not_rerun[path] = still
        return run

    def forget_prepared(self, path: Path) -> None:
        """A planned change was dropped: the next save diffs against what is live again."""
        with self._lock:
            if path in self._applied:
                self._prepared[path] = self._applied[path]


def show_lines_of(path: Path, source: str) -> None:
    """Tracebacks and warnings quote a file's lines through linecache, which keeps what it read first: after a save,
    a warning raised by the swapped step() quoted the line the new one replaced. The lines of the code that runs are
    put where linecache looks, with no modification time, so that no check against the disk drops them (a save not
    applied, a syntax error, is not what runs either)."""
    if source:
        linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
    else:  # a file the session saw created: back to what the disk says
        linecache.cache.pop(str(path), None)


def _classes_old_and_new(changeset: ChangeSet) -> tuple[tuple[type, str], ...]:
    """Each class whose live instances would need a rebuild, and the class now bound to its name where a
    reload made it again (a changed dataclass): a rebuild builds instances of the new one."""
    found: list[tuple[type, str]] = []
    namespace = changeset.module.__dict__ if changeset.module is not None else {}
    for cls, why in changeset.rebuild_if_live.items():
        found.append((cls, why))
        now = namespace.get(cls.__name__)
        if isinstance(now, type) and now is not cls:
            found.append((now, why))
    return tuple(found)
