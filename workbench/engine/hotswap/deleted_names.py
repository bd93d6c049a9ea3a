"""Names a save deleted from a file leave the live module, as a restart would leave them out.

A top-level function, class, import or plain constant that the saved file no longer binds anywhere is removed
from the live module namespace: a call site left behind raises NameError (a step error with file:line that
pauses training) instead of quietly running code that is no longer on disk.

Unless a live object still needs it by name. A function or class that a live object holds is looked up as
`module.name` when that object is pickled (DataLoader workers started with spawn, a pickled state), so it is
kept, and the note names the object; the first save of the file after that object is gone removes it. Searched,
within bounds (live_objects.iter_live: depth 6, 5,000 objects; state_walk.find_instances: depth 4):

- the session state and every project module's globals: dict values, list/tuple/set items, object attributes
  (a DataLoader's `collate_fn`/`worker_init_fn`, a LambdaLR's `lr_lambdas`), closure cells and
  `functools.partial`s of the functions found there, nn.Module hooks;
- for a class, its instances there too, submodules of models included.

Not searched: the frames of running generators, functions' default values, class attributes, the instance
behind a bound method. A holder found only there does not keep the name.

A module global that *is* the deleted object (the name itself, an alias, another module's `from train import
helper`) is a binding, not a holder: it does not keep the name.

Where the file may bind the name in ways its statements do not show, it is kept and the note says why: a name
bound inside an `if`/`try`/`with`/loop (an `if __name__ == "__main__":` block too) that this save changed or
deleted, a name a statement made by calling code (`model = Net()`: it may be the live model), a name a function
of the file declares `global`, and every name when a module statement can bind names it does not spell
(`exec(...)`, `globals().update(...)`).
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.engine.hotswap.code_identity import function_parts, innermost
from workbench.engine.hotswap.live_objects import iter_live, split_roots
from workbench.engine.hotswap.patches import Patch
from workbench.engine.hotswap.scopes import label_for
from workbench.engine.hotswap.source_index import Statement
from workbench.engine.hotswap.statement_slice import bound_names, sets_globals_it_does_not_name
from workbench.engine.state_walk import find_instances

_MISSING: Any = object()
_SHOWN = 3  # holders named in a note
# Statements that may call code: what they bound may be live state (`model = Net()`), never removed.
_CALLS = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)


@dataclass(frozen=True)
class Deleted:
    """A name the saved file no longer binds, removed at commit unless a live object holds its value."""

    name: str
    earlier: bool = False  # deleted by an earlier save and kept then (a live object held it): said only if removed now


def plan_deleted(
    old_region: list[ast.stmt],
    new_statements: list[Statement],
    namespace: dict[str, Any],
    module_name: str,
    filename: str,
    old_source: str,
    new_source: str,
) -> tuple[list[Deleted], list[str]]:
    """The names to remove (each checked for holders at commit), and notes for the names kept whatever holds them.

    `old_region`: the statements the save replaced (in the old file); `new_statements`: the whole saved file.
    """
    removable: dict[str, None] = {}  # ordered set
    unsure: dict[str, str] = {}  # name -> why it stays
    for node in old_region:
        for name, why in _bindings(node, old_source):
            if name in namespace and not (name.startswith("__") and name.endswith("__")):
                if why is None:
                    removable.setdefault(name)
                else:
                    unsure.setdefault(name, why)
    earlier = [
        name
        for name in _defined_by_an_earlier_version(namespace, module_name, filename, new_statements)
        if name not in removable and name not in unsure
    ]
    candidates = {*removable, *unsure, *earlier}
    if not candidates:
        return [], []
    nodes = [statement.node for statement in new_statements]
    bound = _bound_at_top_level(nodes, candidates)
    removable = {name: None for name in removable if name not in bound and name not in unsure}
    unsure = {name: why for name, why in unsure.items() if name not in bound}
    earlier = [name for name in earlier if name not in bound]
    notes: list[str] = []
    opaque = _binds_names_it_does_not_spell(new_statements, new_source)
    if opaque is not None:
        names = [*removable, *unsure]
        if names:
            them = "it" if len(names) == 1 else "them"
            notes.append(
                f"kept {', '.join(names)} (deleted from the file): {opaque} can bind any module name, so whether a "
                f"fresh start binds {them} cannot be told from the file; {them} {'stays' if them == 'it' else 'stay'} until restart"
            )
        return [], notes
    declared = _declared_global(nodes, {*removable, *unsure, *earlier})
    for name, function in declared.items():
        removable.pop(name, None)
        unsure.pop(name, None)
        notes.append(f"kept {name} (deleted from the file): {function}() still binds it (`global {name}`)")
    by_reason: dict[str, list[str]] = {}
    for name, why in unsure.items():
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        notes.append(f"kept {', '.join(names)} (deleted from the file): {why}")
    planned = [Deleted(name) for name in removable]
    planned.extend(Deleted(name, earlier=True) for name in earlier if name not in declared)
    return planned, notes


def _bindings(node: ast.stmt, source: str) -> Iterable[tuple[str, str | None]]:
    """(name, None) for each name a top-level statement binds that can go; (name, why it stays) otherwise."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name, None
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            if alias.name != "*":  # a deleted `from x import *`: which names it bound is not known; they stay
                yield (alias.asname or alias.name).split(".")[0], None
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        if isinstance(node, ast.AnnAssign) and node.value is None:
            return  # `x: int` binds nothing
        made_by_code = any(isinstance(sub, _CALLS) for sub in ast.walk(node))
        why = (
            f"`{label_for(node, source)}` made it by calling code, so it may be live state (a model, a loader); "
            "it stays until restart"
            if made_by_code
            else None
        )
        for name in sorted(bound_names(node)):
            yield name, why
    else:
        why = (
            f"it was bound inside `{label_for(node, source)}`, which this save changed or deleted; names bound under "
            "an `if`, `try`, `with` or loop are kept to be safe (a restart drops them)"
        )
        for name in sorted(bound_names(node)):
            yield name, why


def _defined_by_an_earlier_version(
    namespace: dict[str, Any], module_name: str, filename: str, new_statements: list[Statement]
) -> list[str]:
    """Functions and classes a `def` or `class` statement of this file made that it no longer defines at top
    level: kept by an earlier save because a live object held them (or defined under an `if` now, which
    _bound_at_top_level tells). Only what surely came from a def: an alias (`act = gelu`), a function a factory
    made, a `namedtuple` (its class has no code from this file) are bound by assignments, which stay."""
    defined = {
        s.node.name for s in new_statements if isinstance(s.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    found = []
    for name, value in list(namespace.items()):
        if name in defined or getattr(value, "__module__", None) != module_name:
            continue
        if getattr(value, "__qualname__", None) != name:
            continue
        if isinstance(value, type):
            methods = (innermost(part) for attr in vars(value).values() for part in function_parts(attr))
            if any(_defined_here(method, filename, f"{name}.") for method in methods):
                found.append(name)
        elif _defined_here(innermost(value), filename, name):
            found.append(name)
    return found


def _defined_here(function: Any, filename: str, qualname: str) -> bool:
    """A function a def statement of this file made: its qualified name is `qualname` (or starts with it, ending in '.')."""
    if not isinstance(function, types.FunctionType) or function.__code__.co_filename != filename:
        return False
    own = function.__code__.co_qualname
    return own.startswith(qualname) if qualname.endswith(".") else own == qualname


def _bound_at_top_level(nodes: list[ast.stmt], names: set[str]) -> set[str]:
    """Which of `names` a module statement of the saved file binds (inside an `if`/`try` too)."""
    bound: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in names:
                bound.add(node.name)
        else:
            bound |= bound_names(node) & names
    return bound


def _declared_global(nodes: list[ast.stmt], names: set[str]) -> dict[str, str]:
    """Names a function of the file declares `global` (it may bind them when called): name -> the function."""
    if not names:
        return {}
    found: dict[str, str] = {}
    stack: list[tuple[ast.AST, str | None]] = [(node, None) for node in nodes]
    while stack:
        node, function = stack.pop()
        if isinstance(node, ast.Global) and function is not None:
            for name in names.intersection(node.names):
                found.setdefault(name, function)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        stack.extend((child, function) for child in ast.iter_child_nodes(node))
    return found


def _binds_names_it_does_not_spell(statements: list[Statement], source: str) -> str | None:
    """`exec(...)`, `globals().update(cfg)`, `globals()[k] = v` in a module statement (run at import): which one."""
    for statement in statements:
        node = statement.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if sets_globals_it_does_not_name(node) or any(
            isinstance(sub, ast.Subscript)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Call)
            and isinstance(sub.value.func, ast.Name)
            and sub.value.func.id in ("globals", "vars")
            for sub in ast.walk(node)
        ):
            return f"line {statement.start + 1}: `{label_for(statement.current_node(), source)}`"
    return None


@dataclass
class Holders:
    """Where live objects hold a deleted function or class: paths from the roots."""

    uses: list[str] = field(default_factory=list)  # objects that hold the function or class itself
    instances: list[str] = field(default_factory=list)  # instances of the class

    def __bool__(self) -> bool:
        return bool(self.uses or self.instances)

    def sentence(self) -> str:
        """`state['loader'].collate_fn still uses it`, `the state's scaler is an instance of it`."""
        parts = []
        if self.uses:
            parts.append(f"{_some(self.uses)} still {'uses' if len(self.uses) == 1 else 'use'} it")
        if self.instances:
            one = len(self.instances) == 1
            parts.append(f"{_some(self.instances)} {'is an instance' if one else 'are instances'} of it")
        return " and ".join(parts)

    def count(self) -> int:
        return len(self.uses) + len(self.instances)


def _some(paths: list[str]) -> str:
    return ", ".join(paths[:_SHOWN]) + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")


@dataclass
class RemoveDeleted(Patch):
    """Take names the file no longer binds out of the live module, keeping those a live object still holds.

    `roots` is filled in by the training thread just before commit (the session state and the project's
    module namespaces, as for UpdateLiveCopies) and emptied after: the history must not keep the state alive.
    """

    namespace: dict[str, Any]
    module_name: str
    names: list[Deleted]
    roots: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # what the last apply removed, in order
    _saved: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def apply(self) -> None:
        self.notes, self.removed, self._saved = [], [], {}
        present = {d.name: self.namespace[d.name] for d in self.names if d.name in self.namespace}
        holders = find_holders(self.roots, present)
        for deleted in self.names:
            value = self.namespace.get(deleted.name, _MISSING)
            if value is _MISSING:
                continue
            held = holders.get(deleted.name)
            if held:
                if not deleted.earlier:  # said when it was deleted; said again when it goes
                    self.notes.append(
                        f"kept {self.module_name}.{deleted.name} (deleted from the file): {held.sentence()}; it goes at "
                        f"the first save of the file after {'that object is' if held.count() == 1 else 'those objects are'} "
                        "gone (after a rebuild whose setup() no longer makes it, say)"
                    )
                continue
            self._saved[deleted.name] = value
            del self.namespace[deleted.name]
            self.removed.append(deleted.name)
            if deleted.earlier:
                self.notes.append(f"removed {deleted.name} (deleted from the file earlier; no live object holds it now)")
            else:
                self.notes.append(f"removed {deleted.name} (deleted from the file)")

    def undo(self) -> None:
        self.notes = []
        for name, value in self._saved.items():
            self.namespace[name] = value
        if self._saved:
            one = len(self._saved) == 1
            self.notes.append(
                f"{', '.join(self._saved)} {'is' if one else 'are'} back in the module (the rolled-back save removed "
                f"{'it' if one else 'them'})"
            )
        self._saved, self.removed = {}, []


def find_holders(roots: list[Any], targets: dict[str, Any]) -> dict[str, Holders]:
    """For each target (name -> the live module's value), the live objects that hold it: references to the
    function or class from the state or module globals (iter_live), and instances of the class (find_instances)."""
    wanted = {name: value for name, value in targets.items() if isinstance(value, (type, types.FunctionType))}
    if not wanted:
        return {}
    ids: dict[int, str] = {}
    for name, value in wanted.items():
        ids[id(value)] = name
        ids.setdefault(id(innermost(value)), name)
    state, namespaces = split_roots(roots)
    # A global that is the object itself (its own name, an alias, `from train import helper`) is a binding.
    bindings_left_out = [(f"module {m}", {k: v for k, v in ns.items() if id(v) not in ids}) for m, ns in namespaces]
    found = {name: Holders() for name in wanted}
    for path, obj in iter_live([("state", state), *bindings_left_out]):
        name = ids.get(id(obj))
        if name is not None:
            found[name].uses.append(path)
    for name, value in wanted.items():
        if isinstance(value, type):
            in_state = find_instances(state, value, limit=_SHOWN + 1) if state is not None else []
            found[name].instances.extend("the state" if path == "state" else f"the state's {path}" for path in in_state)
            found[name].instances.extend(find_instances(None, value, limit=_SHOWN + 1, namespaces=namespaces))
    return {name: holders for name, holders in found.items() if holders}
