"""Prepare a reload: diff two versions of a file and plan in-place patches.

Runs off the training thread. Nothing live is touched here: new definitions are
executed in a scratch copy of the module's namespace, and the result is a list
of patches the training thread applies between two steps. If anything fails
(syntax, import, a name error in a class body) a ReloadError says where, and the
old code keeps running.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ContractError
from workbench.engine.hotswap.patches import DELETE, Patch, ReplaceCode, ReplaceReferences, RunInNamespace, SetAttribute, ShiftLines
from workbench.engine.hotswap.compiling import compile_nodes, future_flags
from workbench.engine.hotswap.code_identity import CodeChanges, function_parts, innermost, same_own_content
from workbench.engine.hotswap.construction import (
    built_from_note,
    called_by_setup_note,
    constants_read_when_built,
    constructor_read_note,
    functions_called_when_built,
)
from workbench.engine.hotswap.deleted_names import RemoveDeleted, plan_deleted
from workbench.engine.hotswap.live_objects import UpdateLiveCopies
from workbench.engine.hotswap.scopes import DEF_NODES, Scope, index_statements, label_for
from workbench.engine.hotswap.source_index import SourceIndex, diff_source
from workbench.engine.hotswap.statement_slice import (
    bound_names,
    calls_code,
    line_label,
    sets_globals_it_does_not_name,
    statement_key,
    statement_text,
)
from workbench.engine.hotswap.syntax_trees import parse
from workbench.engine.hotswap.x_statements import StatementsForX

RESTART_HINT = "restart vram-bench to use it"


class ReloadError(Exception):
    """Why a saved file could not be applied; the old code keeps running."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.source: str | None = None  # what was read, to tell a half-written file from a real error


@dataclass
class ChangeSet:
    """Everything one save changes, ready to be applied at a step boundary."""

    path: Path
    module: types.ModuleType | None
    base_source: str
    new_source: str
    patches: list[Patch] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detected_at: float = 0.0
    # Reasons the change cannot be applied to the live state: it needs a rebuild (re-run setup).
    needs_rebuild: list[str] = field(default_factory=list)
    # Classes whose change needs a rebuild only if instances of them are alive (checked at commit).
    rebuild_if_live: dict[type, str] = field(default_factory=dict)
    # Classes whose constructors read a re-bound constant: said (not held) if instances of them are alive.
    note_if_live: dict[type, str] = field(default_factory=dict)
    # Those classes with the re-bound constants their constructors read: a rebuild since this version built them
    # with its values, which a rollback of it does not give back (said then).
    constructor_reads: dict[type, tuple[str, ...]] = field(default_factory=dict)
    # Re-bound constants setup() read when it built the live state, with how: {"n_layer": ["setup -> MLP.__init__"]}.
    built_from: dict[str, list[str]] = field(default_factory=dict)
    # Changed functions setup() calls, with how: {"load_train_objs": "setup -> load_train_objs"}.
    setup_calls: dict[str, str] = field(default_factory=dict)
    # Changed module statements with calls: not run unless the user asks (`run-statements`).
    statements: list[tuple[str, RunInNamespace]] = field(default_factory=list)
    # Those statements and the ones earlier saves left for x, each as `statement_text`: still not re-run once this
    # is applied, so the next save's plan (and a rollback's) names them again rather than forgetting them.
    not_rerun: frozenset[str] = frozenset()
    # The module names this save's own not-re-run statements bind (`config`, `optimizer`): once x or a rebuild has
    # run them, rolling this version back leaves what they made, so the rollback names them and leaves them for x.
    named_binds: frozenset[str] = frozenset()
    index: SourceIndex | None = None  # statement positions of new_source, the base of the next diff

    def built_from_notes(self) -> list[str]:
        """After commit: the constants setup() built the live state from, but those an optimizer note names."""
        named = {name for patch in self.patches if isinstance(patch, UpdateLiveCopies) for name in patch.optimizer_constants}
        return [built_from_note(name, chains) for name, chains in self.built_from.items() if name not in named]


def plan_reload(
    module: types.ModuleType,
    path: Path,
    base: SourceIndex | str,
    new_source: str,
    *,
    required: dict[str, tuple[str, ...]] | None = None,
    other_namespaces: list[dict[str, Any]] | None = None,
    setup: Any = None,
    not_rerun: frozenset[str] = frozenset(),
) -> ChangeSet:
    """Diff `base` (what is live) against `new_source` and plan the patches. `not_rerun`: the module statements
    earlier saves left for x (`statement_text`), which x and R must still run.

    Only the top-level statements that overlap the edited lines are parsed and compared;
    the ones after them just moved (their functions get new line numbers).
    """
    filename = str(path)
    base_index = base if isinstance(base, SourceIndex) else SourceIndex.parse(base, filename)
    try:
        diff = diff_source(base_index, new_source, filename)
        flags = future_flags(s.current_node() for s in diff.new_index.statements)
        compile_nodes(list(diff.new_region), path, flags)
    except SyntaxError as exc:
        raise ReloadError(f"syntax error: {exc.msg}", exc.lineno) from None
    old_index = index_statements(diff.old_region)
    new_index = index_statements(diff.new_region)

    if required:
        defined = defined_names(s.node for s in diff.new_index.statements)
        for name in required:
            if name not in defined:
                raise ReloadError(
                    f"{name}() is no longer defined in {path.name}; the old {name}() keeps running. Put it back and save."
                )

    scratch = _run_in_scratch(module, path, diff.new_region, old_index, new_index, flags)
    if required:
        try:
            from workbench.engine.project import check_contract, check_contract_names_kept

            check_contract({k: scratch[k] for k in required if k in scratch}, path)
            check_contract_names_kept(new_source, path)
        except ContractError as exc:
            raise ReloadError(exc.message, exc.line) from None

    plan = _Planner(module, scratch, path, new_source, other_namespaces or [], flags)
    changeset = ChangeSet(path=path, module=module, base_source=base_index.source, new_source=new_source)
    changeset.index = diff.new_index
    for key, new in new_index.items():
        plan.statement(old_index.get(key), new)
    for statement in diff.after:
        if plan.dirty and isinstance(statement.node, (ast.Assign, ast.AnnAssign)):
            for scope in index_statements([statement.current_node()]).values():
                plan.dependent_constant(scope)
        if diff.shift:
            plan.shift_lines(statement.node, diff.shift)
    plan.later_bindings([s.current_node() for s in diff.new_index.statements])
    plan.in_source_order()
    plan.constants_the_state_was_built_from()
    plan.functions_setup_called(setup)
    plan.statements_calling_changed_functions([s.current_node() for s in diff.new_index.statements])
    live_copies = _live_copies_patch(plan.patches)
    if live_copies is not None:
        plan.patches.append(live_copies)
    deleted, kept = plan_deleted(
        diff.old_region, diff.new_index.statements, module.__dict__, module.__name__, filename, base_index.source, new_source
    )
    plan.notes.extend(kept)
    if deleted:
        plan.patches.append(RemoveDeleted(module.__dict__, module.__name__, deleted))
    changeset.patches, changeset.changed, changeset.notes = plan.patches, plan.changed, plan.notes
    changeset.rebuild_if_live = plan.rebuild_if_live
    changeset.note_if_live = plan.note_if_live
    changeset.constructor_reads = plan.constructor_reads
    changeset.built_from = plan.built_from
    changeset.setup_calls = plan.setup_calls
    module_nodes = [s.current_node() for s in diff.new_index.statements]
    plan.carry_not_rerun(module_nodes, not_rerun)
    changeset.statements = plan.statements_to_run(module_nodes)
    changeset.not_rerun = frozenset(statement_text(node) for node in plan.named_for_x())
    # What a rollback must leave for x again when x or R ran it since: the names the edited statements bind, and
    # those of every statement x runs for them (`parser.add_argument(default=6)` binds nothing; `args = ...` and the
    # `batch_size` its override sets are what it changes).
    changeset.named_binds = frozenset(name for node in plan.edited_statements for name in bound_names(node))
    if plan.edited_statements:
        changeset.named_binds |= frozenset(name for _, run in changeset.statements for name in run.binds)
    if "setup" in plan.changed and required:
        changeset.needs_rebuild.append("setup() changed: the live state was built by the old setup()")
    return changeset


def plan_not_rerun(
    module: types.ModuleType, path: Path, source: str, not_rerun: frozenset[str], others: list[dict[str, Any]]
) -> tuple[list[tuple[str, RunInNamespace]], frozenset[str]]:
    """What x runs for the statements left for it that `source` (the live code, after a rollback) still holds, and
    those statements' texts; the ones the rollback took out of the file are dropped (their old value is live)."""
    if not not_rerun:
        return [], frozenset()
    try:
        body = parse(source, str(path)).body
    except SyntaxError:
        return [], frozenset()
    named = [node for node in body if statement_text(node) in not_rerun]
    if not named:
        return [], frozenset()
    run, _ = StatementsForX(module.__dict__, others, source, path, future_flags(body)).plan(body, named)
    return run, frozenset(statement_text(node) for node in named)


def defined_names(nodes: Any) -> set[str]:
    """Names that top-level statements bind (defs, classes, plain assignments), without dumping ASTs."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _live_copies_patch(patches: list[Patch]) -> UpdateLiveCopies | None:
    """A last patch that finds closures, generators and optimizers still holding the old code or values."""
    changes = CodeChanges()
    for patch in patches:
        if isinstance(patch, ReplaceCode):
            changes.add(patch.target.__code__, patch.code)
    rebinds = [p for p in patches if isinstance(p, RunInNamespace) and p.binds]
    if not (changes.has_live_copies or rebinds):
        return None
    return UpdateLiveCopies(changes, rebinds)


def _first_edited(old: Scope | None, new: Scope) -> ast.stmt:
    """The first statement of `new` that differs from its place in `old`: a scope of several statements binding one
    name (`model = Net()`, then `model = Wrap(model)`) is quoted by the one the user edited."""
    before = [ast.dump(node) for node in old.nodes] if old is not None else []
    for position, node in enumerate(new.nodes):
        if position >= len(before) or ast.dump(node) != before[position]:
            return node
    return new.nodes[0]


def _changed_or_moved(old: Scope | None, new: Scope) -> bool:
    return old is None or old.fingerprint != new.fingerprint or old.lines != new.lines


def _run_in_scratch(
    module: types.ModuleType,
    path: Path,
    new_body: list[ast.stmt],
    old_index: dict[tuple[str, str], Scope],
    new_index: dict[tuple[str, str], Scope],
    flags: int,
) -> dict[str, Any]:
    """Execute imports, plain constants and changed definitions in a copy of the module's globals."""
    keep: set[int] = set()
    for key, scope in new_index.items():
        if scope.kind in ("import", "assign") and scope.is_rerunnable():
            keep.update(id(n) for n in scope.nodes)
        elif scope.kind in ("def", "class") and _changed_or_moved(old_index.get(key), scope):
            keep.update(id(n) for n in scope.nodes)
    body = [node for node in new_body if id(node) in keep]
    scratch = dict(module.__dict__)
    try:
        exec(compile_nodes(body, path, flags), scratch)  # noqa: S102
    except Exception as exc:  # noqa: BLE001 - any failure here is reported, nothing live changed
        raise ReloadError(f"{type(exc).__name__}: {exc}{_raised_elsewhere(exc, path)}", _line_in(exc, path)) from None
    return scratch


def _raised_elsewhere(exc: BaseException, path: Path) -> str:
    """Where in another file of the project the error came from (a module the saved file imports), if it did:
    the event's line is the saved file's, and alone it would point at an innocent `import`."""
    where: tuple[str, int] | None = None
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        where = (exc.filename, exc.lineno)
    else:
        tb = exc.__traceback__
        while tb is not None:
            where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb = tb.tb_next
    if where is None or where[0] == str(path):
        return ""
    file = Path(where[0])
    if not file.is_relative_to(path.parent):
        return ""
    return f" (raised at {file.relative_to(path.parent)}:{where[1]})"


def _line_in(exc: BaseException, path: Path) -> int | None:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


_MISSING = object()


def _own_lines_changed(live: types.FunctionType, new: types.FunctionType) -> bool:
    """The function's own code or defaults changed, not only a function nested in it: the closures it made are
    patched live (found by name), so a factory whose inner function alone changed made nothing that keeps old code."""
    return (not same_own_content(live.__code__, new.__code__) or _differ(live.__defaults__, new.__defaults__)
            or _differ(live.__kwdefaults__, new.__kwdefaults__))


def _differ(a: object, b: object) -> bool:
    """`a != b` for defaults that may hold tensors (whose `!=` has no single truth value): then, unless identical."""
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - a default whose comparison raises
        return a is not b


def is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, which never runs in a session (the entry file is imported as a module)."""
    return isinstance(node, ast.If) and "__name__" in {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}


def _called_names(node: ast.stmt) -> Iterator[str]:
    """The plain names a statement calls: `make_opt` in `opt = make_opt(model.parameters())`, `MLP` in `MLP()`."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            yield call.func.id


def _plain_if(node: ast.stmt) -> bool:
    """An `if` whose test and branches only read and bind names: nothing is called, counted or defined."""
    if not isinstance(node, ast.If):
        return False
    unsafe = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.AugAssign, ast.FunctionDef,
              ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.While, ast.With, ast.Try, ast.Import,
              ast.ImportFrom, ast.Global, ast.Delete)
    return not any(isinstance(sub, unsafe) for sub in ast.walk(node))


def _none_guards(function: ast.stmt) -> list[ast.If]:
    """`if NAME is None:` blocks in a function (not in functions nested in it): code run on first use."""
    found = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Is)
            and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value is None
        ):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _literal_values(scope: Scope) -> dict[str, object]:
    """`batch_size = 12` -> {"batch_size": 12}: a constant's value from a line of plain literals, else nothing."""
    node = scope.node
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        return {}
    try:
        return {node.targets[0].id: ast.literal_eval(node.value)}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return {}


def _decorators(node: ast.stmt) -> str:
    return "\n".join(ast.dump(d) for d in getattr(node, "decorator_list", []))


def _class_header(node: ast.ClassDef) -> str:
    return "\n".join(ast.dump(x) for x in (*node.bases, *node.keywords, *node.decorator_list))


def _function_pairs(old: Any, new: Any) -> list[tuple[types.FunctionType, types.FunctionType]] | None:
    """Matching (live, new) functions inside two class attributes, or None if their shapes differ."""
    if type(old) is not type(new):
        return None
    if isinstance(old, (staticmethod, classmethod)):
        old, new = old.__func__, new.__func__
    if isinstance(old, property):
        pairs = []
        for part in ("fget", "fset", "fdel"):
            o, n = getattr(old, part), getattr(new, part)
            if (o is None) != (n is None):
                return None
            if o is not None:
                pairs.append((innermost(o), innermost(n)))
        return pairs if all(isinstance(p, types.FunctionType) for pair in pairs for p in pair) else None
    o, n = innermost(old), innermost(new)
    if isinstance(o, types.FunctionType) and isinstance(n, types.FunctionType):
        return [(o, n)]
    return None


def _same_freevars(pairs: list[tuple[types.FunctionType, types.FunctionType]]) -> bool:
    # CPython only accepts a new __code__ with the same free variables as the old one.
    return all(o.__code__.co_freevars == n.__code__.co_freevars for o, n in pairs)


class _Planner:
    """Collects patches, changed names and notes for one file."""

    def __init__(
        self,
        module: types.ModuleType,
        scratch: dict[str, Any],
        path: Path,
        source: str,
        others: list[dict[str, Any]],
        flags: int = 0,
    ) -> None:
        self.live = module.__dict__
        self.flags = flags  # the file's `from __future__` imports: every statement run again is compiled with them
        self.others = others
        self.rebuild_if_live: dict[type, str] = {}
        self.note_if_live: dict[type, str] = {}
        self.constructor_reads: dict[type, tuple[str, ...]] = {}
        self.built_from: dict[str, list[str]] = {}
        self.scratch = scratch
        self.path = path
        self.source = source
        self.patches: list[Patch] = []
        self.changed: list[str] = []
        self.notes: list[str] = []
        self.dirty: set[str] = set()  # constants re-bound so far, in source order
        self.rebound_at: dict[str, int] = {}  # each re-bound constant: the line of its first re-run statement
        self.rerun_nodes: set[tuple[int, int]] = set()  # the statements run again (statement_key)
        self.statement_lines: dict[int, int] = {}  # id of each module statement's RunInNamespace -> its line
        self.old_values: dict[str, object] = {}  # what an edited constant's old line gave it (`batch_size = 12`)
        self.edited_statements: list[ast.stmt] = []  # module statements with calls: not re-run unless asked
        self.carried_statements: list[ast.stmt] = []  # those earlier saves left for x, found in this source
        self.patched_functions: dict[str, types.FunctionType] = {}  # module functions whose code is replaced in place
        self.setup_calls: dict[str, str] = {}  # those setup() calls, with how
        self.x = StatementsForX(self.live, others, source, path, flags)  # what x runs, and what the notes offer

    def statement(self, old: Scope | None, new: Scope) -> None:
        moved_only = old is not None and old.fingerprint == new.fingerprint
        if new.kind == "assign" and moved_only:
            self.dependent_constant(new)
            return
        if not _changed_or_moved(old, new):
            return
        if new.kind == "def":
            self.function(old, new, moved_only)
        elif new.kind == "class":
            self.klass(old, new, moved_only)
        elif moved_only or new.kind == "doc":
            return
        elif new.is_rerunnable() and self.lambda_in_place(new):
            return
        elif new.is_rerunnable():
            if old is not None:
                self.old_values.update(_literal_values(old))
            self.rerun(new)
        elif _plain_if(new.node):
            # `if args.batch_size is not None: batch_size = ...`: it calls nothing, so it runs again like a constant
            self.rerun(new, binds=tuple(sorted(bound_names(new.node))))
        else:
            edited = _first_edited(old, new)
            label = f"line {edited.lineno}: `{label_for(edited, self.source)}`"
            self.edited_statements.extend(new.nodes)
            self.notes.append(
                f"{label} was not re-run: module statements that call code run once at import, and running it "
                f"could rebuild what is live; {self.x.offer(new.nodes)}"
            )

    def carry_not_rerun(self, module: list[ast.stmt], not_rerun: frozenset[str]) -> None:
        """Name again the statements earlier saves left for x that are still in the file as they were: a later save
        that re-runs nothing must not drop them (x then said there was nothing to run, and R built from their old
        values, while the file held new ones). One edited since is named by this save's own diff, if at all."""
        if not not_rerun:
            return
        named = {statement_key(node) for node in self.edited_statements}
        self.carried_statements = [node for node in module
                                   if statement_key(node) not in named and statement_text(node) in not_rerun]

    def named_for_x(self) -> list[ast.stmt]:
        return [*self.edited_statements, *self.carried_statements]

    def statements_to_run(self, module: list[ast.stmt]) -> list[tuple[str, RunInNamespace]]:
        """What `run-statements` (x) runs for the statements named so far (x_statements.py); its notes join ours
        when this save named any (those carried from earlier saves were said then)."""
        run, notes = self.x.plan(module, self.named_for_x())
        if self.edited_statements:
            self.notes.extend(notes)
        return run

    def shift_lines(self, node: ast.stmt, shift: int) -> None:
        """A def or class that only moved: its live functions get their new line numbers (tracebacks)."""
        functions: list[types.FunctionType] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(innermost(self.live.get(node.name)))
        elif isinstance(node, ast.ClassDef) and isinstance(self.live.get(node.name), type):
            for attr in vars(self.live[node.name]).values():
                for part in function_parts(attr):
                    functions.append(innermost(part))
        filename = str(self.path)
        targets = [f for f in functions if isinstance(f, types.FunctionType) and f.__code__.co_filename == filename]
        if targets:
            self.patches.append(ShiftLines(targets, shift))

    def lambda_in_place(self, scope: Scope) -> bool:
        """`ACT = lambda x: ...` edited: give the live lambda the new code (the state may hold it)."""
        node = scope.node
        live, new = self.live.get(scope.name), self.scratch.get(scope.name)
        if not (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Lambda)):
            return False
        if not (isinstance(live, types.FunctionType) and isinstance(new, types.FunctionType)):
            return False
        if live.__name__ != "<lambda>" or live.__code__.co_freevars != new.__code__.co_freevars:
            return False
        self.patches.append(ReplaceCode.taking(live, new))
        self.changed.append(scope.name)
        return True

    def rerun(self, scope: Scope, binds: tuple[str, ...] | None = None) -> None:
        """Run an import, a plain constant or a call-free `if` again in the live module; what it binds is dirty."""
        if binds is None:
            binds = tuple(scope.name.split(",")) if scope.kind == "assign" else ()
        self._run_statement(RunInNamespace(compile_nodes(scope.nodes, self.path, self.flags), self.live, binds), scope.line)
        self.changed.extend(binds)
        self.dirty.update(binds)
        self.rerun_nodes.update(statement_key(node) for node in scope.nodes)
        for name in binds:
            self.rebound_at.setdefault(name, scope.line)

    def constants_the_state_was_built_from(self) -> None:
        """A re-bound constant that setup() read (itself, or through what it calls), or that a constructor of this
        module's classes read: what was built keeps the old value (n_layer = 2 -> 3 leaves 2 blocks), said, not held:
        the new value is what the next step reads."""
        changed = sorted(self.dirty)
        if not changed:
            return
        by_setup = constants_read_when_built(self.live, changed, self.live.get("setup"))
        self.built_from.update(by_setup)
        rest = [name for name in changed if name not in by_setup]
        for cls in [v for v in self.live.values() if isinstance(v, type) and v.__module__ == self.live.get("__name__")]:
            read = constants_read_when_built(self.live, rest, cls)
            if read:
                self.constructor_reads[cls] = tuple(sorted(read))
                self.note_if_live[cls] = constructor_read_note(cls.__name__, self.constructor_reads[cls])

    def functions_setup_called(self, setup: Any) -> None:
        """A changed function setup() called (`load_train_objs()`, `make_model()`): what it built for the live state is
        the old code's result, which a fresh start would not have. Said, as for a constant setup() read."""
        if not self.patched_functions or setup is None:
            return
        modules = {str(ns.get("__name__")) for ns in (self.live, *self.others)}
        self.setup_calls = functions_called_when_built(self.patched_functions.values(), setup, modules)
        self.notes.extend(called_by_setup_note(name, chain) for name, chain in self.setup_calls.items())

    def statements_calling_changed_functions(self, module: list[ast.stmt]) -> None:
        """A module statement that calls a changed function (`opt = make_opt(model.parameters())` at the top of a
        script) ran once, at import: what it made is the old code's result. Said, and x runs it, as for an edited one."""
        if not self.patched_functions:
            return
        modules = {str(ns.get("__name__")) for ns in (self.live, *self.others)}
        noted = {statement_key(node) for node in self.edited_statements}
        for node in module:
            if statement_key(node) in noted or isinstance(node, (*DEF_NODES, ast.ClassDef, ast.Import, ast.ImportFrom)) \
                    or is_main_guard(node):
                continue
            called: dict[str, str] = {}
            for name in dict.fromkeys(_called_names(node)):
                root = self.live.get(name)
                if isinstance(root, (types.FunctionType, type)) and getattr(root, "__module__", None) in modules:
                    called.update(functions_called_when_built(self.patched_functions.values(), root, modules))
            if called:
                self.edited_statements.append(node)
                how = "; ".join(f"{fn} ({chain})" if chain != fn else fn for fn, chain in called.items())
                self.notes.append(
                    f"line {node.lineno}: `{label_for(node, self.source)}` calls changed code ({how}) and was not re-run: "
                    "module statements that call code run once at import, and running it could rebuild what is live, "
                    f"so what it made keeps what the old code made; {self.x.offer([node])}"
                )

    def _run_statement(self, patch: RunInNamespace, line: int) -> None:
        self.patches.append(patch)
        self.statement_lines[id(patch)] = line

    def in_source_order(self) -> None:
        """Module statements run again in the order of the file, as a fresh start runs them: a constant derived
        below an override (`tokens = batch_size * block`) is computed after the override ran again, not before."""
        slots = [i for i, patch in enumerate(self.patches) if id(patch) in self.statement_lines]
        ordered = sorted((self.patches[i] for i in slots), key=lambda patch: self.statement_lines[id(patch)])
        for i, patch in zip(slots, ordered):
            self.patches[i] = patch

    def later_bindings(self, body: list[ast.stmt]) -> None:
        """A constant re-bound here may be bound again further down, as script-style trainers override their
        defaults (`if args.batch_size is not None: batch_size = args.batch_size`): a fresh start ends with
        that value, so such a statement runs again too, or, when it calls code, the log says so and x runs it."""
        for node in body:
            if statement_key(node) in self.rerun_nodes or isinstance(node, (*DEF_NODES, ast.ClassDef)):
                continue
            before = {n for n in self.dirty if node.lineno > self.rebound_at.get(n, node.lineno)}
            opaque = sets_globals_it_does_not_name(node)
            if opaque:  # only the names it really set at start: the live value is not what the old line gave
                before = {n for n in before if not self._kept_its_old_value(n)}
            names = sorted(before if opaque else bound_names(node) & before)
            if not names:
                continue
            label = line_label(node, self.source)
            if calls_code(node):
                if any(statement_key(node) == statement_key(n) for n in self.edited_statements):
                    continue  # already named, with x offered (it uses a changed constant)
                self.edited_statements.append(node)
                if opaque:
                    shown = ", ".join(f"{n} = {self.live.get(n)!r}" for n in names)
                    what = f"set {shown} at start, over the edited line's old value, and was not re-run (it calls code):"
                else:
                    what = f"binds {', '.join(names)} again but was not re-run (it calls code), so"
                self.notes.append(
                    f"{label} {what} the edited value stays where a fresh start would take this line's; "
                    f"{self.x.offer([node])}"
                )
                continue
            self._run_statement(RunInNamespace(compile_nodes((node,), self.path, self.flags), self.live, tuple(names)), node.lineno)
            self.rerun_nodes.add(statement_key(node))
            self.notes.append(f"{label} binds {', '.join(names)} again, as a fresh start would: it ran again too")

    def _kept_its_old_value(self, name: str) -> bool:
        """Whether the live value is still what the edited line gave it before the save (so nothing overrode it)."""
        if name not in self.old_values:
            return False  # not a plain literal: cannot tell, so say it
        live = self.live.get(name, _MISSING)
        old = self.old_values[name]
        return type(live) is type(old) and live == old

    def dependent_constant(self, scope: Scope) -> None:
        """An unchanged constant computed from a changed one (`B = A * 2`) is recomputed too.

        A scope may be several statements binding one name (`model = Net(DIM)`, then `model = Wrap(model)`): the note
        quotes the first that reads a changed constant, and x is offered them all (the later ones wrap what it makes)."""
        reads = {
            node: {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} & self.dirty
            for node in scope.nodes
        }
        stale = sorted(set().union(*reads.values()))
        if not stale:
            return
        if scope.is_rerunnable():
            self.rerun(scope)
        else:
            reader = next(node for node in scope.nodes if reads[node])
            self.edited_statements.extend(scope.nodes)
            self.notes.append(
                f"line {reader.lineno}: `{label_for(reader, self.source)}` uses {', '.join(stale)} but was not "
                f"re-run (it calls code), so it keeps its old value; {self.x.offer(scope.nodes)}"
            )

    def function(self, old: Scope | None, new: Scope, moved_only: bool) -> None:
        name = new.name
        live_obj, new_obj = self.live.get(name), self.scratch.get(name)
        if old is not None and live_obj is not None and _decorators(old.node) == _decorators(new.node):
            pairs = _function_pairs(live_obj, new_obj)
            if pairs and _same_freevars(pairs):
                self.patches.extend(ReplaceCode.taking(o, n, moved_only=moved_only) for o, n in pairs)
                if not moved_only:
                    self.changed.append(name)
                    inner, inner_new = innermost(live_obj), innermost(new_obj)
                    if name != "setup" and isinstance(inner, types.FunctionType) and isinstance(inner_new, types.FunctionType) \
                            and _own_lines_changed(inner, inner_new):
                        self.patched_functions[name] = inner
                    self.first_use_branches(name, old.node, new.node)
                return
        # New function, or its decorators changed: define it afresh in the live module.
        self.redefine(new)
        if old is not None and live_obj is not None:
            self.notes.append(
                f"{name}: its decorators changed, so it was defined again (decorators re-run) and re-bound in the "
                "project's modules; objects that stored the old function keep it"
            )

    def first_use_branches(self, name: str, old: ast.stmt, new: ast.stmt) -> None:
        """`if opt2 is None: opt2 = SGD(...)` in step(): an edit inside that branch never runs again once the global
        is set, so what the old lines made stays. Say so, naming the global (a fresh start would run the new lines)."""
        old_branches = {ast.dump(b.test): ast.dump(ast.Module(body=b.body, type_ignores=[])) for b in _none_guards(old)}
        for branch in _none_guards(new):
            guard = branch.test.left.id  # type: ignore[attr-defined]
            before = old_branches.get(ast.dump(branch.test))
            if before is None or before == ast.dump(ast.Module(body=branch.body, type_ignores=[])):
                continue
            if self.live.get(guard) is not None:
                self.notes.append(
                    f"{name}(): the edited lines under `if {guard} is None:` (line {branch.lineno}) ran when {guard} was "
                    f"first made and will not run again while it is set: {guard} keeps what the old lines made (set it "
                    "to None, or rebuild if setup() does, to make it again)"
                )

    def redefine(self, scope: Scope) -> None:
        """Run a def/class statement again in the live module and point the project's other modules at the result."""
        name = scope.name
        self.patches.append(RunInNamespace(compile_nodes(scope.nodes, self.path, self.flags), self.live, (name,)))
        if name in self.live:
            self.patches.append(ReplaceReferences(self.others, self.live[name], self.live, name))
        self.changed.append(name)

    def klass(self, old: Scope | None, new: Scope, moved_only: bool) -> None:
        name = new.name
        live_cls, new_cls = self.live.get(name), self.scratch.get(name)
        if old is None or not isinstance(live_cls, type):
            self.redefine(new)
            return
        old_node, new_node = old.node, new.node
        assert isinstance(old_node, ast.ClassDef) and isinstance(new_node, ast.ClassDef)
        old_members = index_statements(old_node.body)
        new_members = index_statements(new_node.body)
        is_dataclass = "__dataclass_fields__" in live_cls.__dict__
        fields_changed = is_dataclass and any(
            scope.kind == "assign" and (key not in old_members or old_members[key].fingerprint != scope.fingerprint)
            for key, scope in new_members.items()
        ) | any(scope.kind == "assign" and key not in new_members for key, scope in old_members.items())
        if _class_header(old_node) != _class_header(new_node) or not isinstance(new_cls, type) or fields_changed:
            # The class object itself must be made again; objects built from the old one are not converted.
            what = "dataclass fields or defaults changed" if fields_changed else "its bases or decorators changed"
            self.redefine(new)
            self.rebuild_if_live[live_cls] = f"class {name} (line {new.line}): {what}"
            return
        for key, member in new_members.items():
            self.member(live_cls, new_cls, old_members.get(key), member)
        for key, gone in old_members.items():
            if key in new_members or gone.kind not in ("def", "assign"):
                continue
            if gone.name == "__init__":
                self.rebuild_if_live[live_cls] = f"{name}.__init__ was removed"
            for attr in gone.name.split(","):
                self.patches.append(SetAttribute(live_cls, attr, DELETE))
                self.changed.append(f"{name}.{attr} (removed)")

    def member(self, live_cls: type, new_cls: type, old: Scope | None, new: Scope) -> None:
        if not _changed_or_moved(old, new):
            return
        moved_only = old is not None and old.fingerprint == new.fingerprint
        cls_name = live_cls.__name__
        qual = f"{cls_name}.{new.name}"
        if new.kind == "def":
            live_attr = live_cls.__dict__.get(new.name)
            new_attr = new_cls.__dict__.get(new.name)
            pairs = _function_pairs(live_attr, new_attr) if old is not None and live_attr is not None else None
            if pairs and _same_freevars(pairs) and _decorators(old.node) == _decorators(new.node):  # type: ignore[union-attr]
                self.patches.extend(ReplaceCode.taking(o, n, moved_only=moved_only) for o, n in pairs)
                if not moved_only:
                    self.changed.append(qual)
                    if new.name == "__init__":
                        self.rebuild_if_live[live_cls] = f"{qual} changed (line {new.line})"
                    elif len(pairs) == 1 and _own_lines_changed(*pairs[0]):
                        # A method setup() calls (`trainer.prepare()`) built what it built with the old code: said
                        # as for a function (construction.py follows method calls by name).
                        self.patched_functions[qual] = pairs[0][0]
                return
            rebuilt = _rebind(new_attr, self.live, live_cls)
            if rebuilt is None:
                self.notes.append(f"{qual} (line {new.line}) cannot be applied in place; {RESTART_HINT}")
                return
            self.patches.append(SetAttribute(live_cls, new.name, rebuilt))
            self.changed.append(qual)
            if new.name == "__init__":
                self.rebuild_if_live[live_cls] = f"{qual} changed (line {new.line})"
        elif moved_only or new.kind == "doc":
            return
        elif new.kind == "assign":
            for attr in new.name.split(","):
                self.patches.append(SetAttribute(live_cls, attr, new_cls.__dict__.get(attr, DELETE)))
                self.changed.append(f"{cls_name}.{attr}")
        else:
            self.notes.append(f"{qual} (line {new.line}): this kind of class-body change is not applied; {RESTART_HINT}")


def _rebind(attr: Any, live_globals: dict[str, Any], live_cls: type) -> Any:
    """A scratch class member re-made to live in the real module and class (for added methods)."""

    def rebuild(fn: Any) -> types.FunctionType | None:
        if fn is None:
            return None
        if not isinstance(fn, types.FunctionType) or hasattr(fn, "__wrapped__"):
            raise _CannotRebind
        cells = []
        for free in fn.__code__.co_freevars:
            if free != "__class__":
                raise _CannotRebind
            cells.append(types.CellType(live_cls))
        out = types.FunctionType(fn.__code__, live_globals, fn.__name__, fn.__defaults__, tuple(cells) or None)
        out.__kwdefaults__ = fn.__kwdefaults__
        out.__doc__ = fn.__doc__
        out.__qualname__ = fn.__qualname__
        out.__annotations__ = dict(fn.__annotations__)
        return out

    try:
        if isinstance(attr, property):
            return property(rebuild(attr.fget), rebuild(attr.fset), rebuild(attr.fdel), attr.__doc__)
        if isinstance(attr, (staticmethod, classmethod)):
            return type(attr)(rebuild(attr.__func__))
        return rebuild(attr)
    except _CannotRebind:
        return None


class _CannotRebind(Exception):
    pass
