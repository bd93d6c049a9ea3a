"""Find the copies of old code that live objects still hold, at commit time.

Replacing a function's `__code__` updates every reference to that function.
But closures made from a nested `def` or `lambda` (a loss function built by a
factory in setup(), a forward hook, an activation stored in the state) are
separate function objects holding the old nested code, and a running generator
(a data iterator) keeps its old frame. This walks the session state, the
project's modules and nn.Module hooks, patches the closures it can, and says
what it cannot.
"""

from __future__ import annotations

import functools
import itertools
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.engine.hotswap.code_identity import CodeChanges, CodeName, code_name, same_content
from workbench.engine.hotswap.patches import Patch, RunInNamespace
from workbench.engine.hotswap.sets_in_code import where_code_sets

_MAX_DEPTH = 6
_MAX_OBJECTS = 5_000
# Closures sit near the top of a state, not at item 50,000 of a dataset list: look at the first items only.
_MAX_ITEMS = 256


def iter_live(roots: list[Any]) -> Iterator[tuple[str, Any]]:
    """(path, object) for every function, generator and class reachable from the roots, within bounds
    (a class only where something holds the class itself: instances are walked, not their types)."""
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, name, 0) for name, root in reversed(list(_named(roots)))]
    while stack and len(seen) < _MAX_OBJECTS:
        obj, path, depth = stack.pop()
        if id(obj) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            yield path, obj
            for cell in obj.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:
                    continue
                if callable(contents):
                    stack.append((contents, f"{path}.<closure>", depth + 1))
            if hasattr(obj, "__wrapped__"):
                stack.append((obj.__wrapped__, path, depth + 1))
        elif isinstance(obj, types.GeneratorType):
            yield path, obj
        elif isinstance(obj, (types.MethodType, functools.partial)):
            stack.append((getattr(obj, "__func__", None) or getattr(obj, "func", None), path, depth + 1))
        elif isinstance(obj, torch.nn.Module):
            for name, sub in obj.named_modules(prefix=path):
                seen.add(id(sub))
                for key, value in vars(sub).items():
                    if "hook" in key and isinstance(value, dict):
                        for hook in value.values():
                            stack.append((hook, f"{name}.{key}", depth + 1))
                    elif not key.startswith("_") and callable(value) and not isinstance(value, torch.nn.Module):
                        stack.append((value, f"{name}.{key}", depth + 1))
        elif isinstance(obj, dict):
            for key, value in list(itertools.islice(obj.items(), _MAX_ITEMS)):
                label = repr(key) if isinstance(key, (str, int)) else type(key).__name__
                stack.append((value, f"{path}[{label}]", depth + 1))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, value in enumerate(itertools.islice(obj, _MAX_ITEMS)):
                stack.append((value, f"{path}[{i}]", depth + 1))
        elif isinstance(obj, type):
            yield path, obj  # not walked: its methods are patched on the class itself
        elif isinstance(obj, (types.ModuleType, torch.Tensor, torch.optim.Optimizer, str, bytes, int, float)):
            continue  # nothing in these holds user closures worth the walk (optimizers: only tensors)
        elif hasattr(obj, "__dict__"):
            for key, value in list(vars(obj).items()):
                stack.append((value, f"{path}.{key}", depth + 1))


def _running_generator_note(path: str, made_by: str) -> str:
    """A generator setup()'s state holds is made again by R (setup() runs again); one only a module global holds was
    made by a module statement, which R does not run again (an x-transformers trainer, ported: `train_loader =
    cycle(DataLoader(...))` at the top of the script kept the old cycle() through R and x, as the note said R would
    make it again)."""
    if not path.startswith("module "):
        return f"{path} is a running generator made by the old {made_by}(): it keeps the old code until it is created " \
               "again (R rebuilds)"
    return (f"{path.removeprefix('module ')} is a running generator made by the old {made_by}() at import: it keeps "
            "the old code for the rest of the session, since R makes again what setup() makes and the models and "
            "optimizers built at import, not this; to run the new code, make it in setup() (R then makes it again), "
            "or edit the statement that makes it and press x, or restart")


def _named(roots: list[Any]) -> Iterator[tuple[str, Any]]:
    for root in roots:
        if isinstance(root, tuple) and len(root) == 2 and isinstance(root[0], str):
            yield root
        else:
            yield "state", root


def split_roots(roots: list[Any]) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The session state (None if not given) and the module namespaces, as (`train`, its globals), in `roots`."""
    named = list(_named(roots))
    state = next((root for name, root in named if name == "state"), None)
    return state, [(name.removeprefix("module "), root) for name, root in named if name.startswith("module ")]


@dataclass
class UpdateLiveCopies(Patch):
    """Give closures the new nested code; note generators and optimizers still holding old values.

    Live copies are matched to new code by stable name (file and qualified name, see
    code_identity.py), never by code object: the closure a factory made three saves and a
    line shift ago is found as surely as one made a moment ago.

    `roots` is filled in by the training thread just before commit: the session state,
    and the project's module namespaces.
    """

    changes: CodeChanges
    rebinds: list[RunInNamespace]
    roots: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    optimizer_constants: set[str] = field(default_factory=set)  # constants a note said an optimizer was built with
    # Weak: the history keeps patches, and a closure may hold a whole model (a loss closing over it).
    _patched: list[tuple[weakref.ref[types.FunctionType], types.CodeType]] = field(default_factory=list)

    def apply(self) -> None:
        self.notes, self._patched, self.optimizer_constants = [], [], set()
        held_back: list[str] = []
        ambiguous: list[str] = []
        removed: list[str] = []
        captured: list[str] = []
        for path, obj in iter_live(self.roots):
            if isinstance(obj, types.FunctionType):
                name = code_name(obj.__code__)
                if obj.__code__.co_freevars and self._maker_changed(name):
                    captured.append(f"{path} ({name[1]})")
                new = self.changes.new.get(name)
                if new is None:
                    if name in self.changes.ambiguous:
                        ambiguous.append(f"{path} ({name[1]})")
                    elif name in self.changes.changed:
                        removed.append(f"{path} ({name[1]})")
                    continue
                if new is obj.__code__:
                    continue
                if new.co_freevars != obj.__code__.co_freevars:
                    held_back.append(f"{path} ({name[1]})")
                    continue
                self._patched.append((weakref.ref(obj), obj.__code__))
                obj.__code__ = new
            elif isinstance(obj, types.GeneratorType) and obj.gi_frame is not None:
                name = code_name(obj.gi_code)
                if name in self.changes.changed or name in self.changes.ambiguous:
                    self.notes.append(_running_generator_note(path, name[1]))
        if self._patched:
            self.notes.append(f"updated {len(self._patched)} live closure(s) made from the changed code")
        self._name_all(
            captured,
            "these live closures keep the values the old code of the function that made them gave the variables "
            "they capture (R rebuilds them)",
        )
        self._name_all(
            held_back,
            "the variables these closures capture changed, so their live copies keep the old code (R rebuilds them)",
        )
        self._name_all(
            ambiguous,
            "these live closures come from a scope that defines several functions of the same name (lambdas), so "
            "which new one replaces which cannot be told: they keep the old code (R rebuilds them)",
        )
        self._name_all(
            removed,
            "these live closures were made from code that is no longer in the file (renamed or removed), so they "
            "keep the old code (R rebuilds them)",
        )
        self._note_optimizers()

    def _note_optimizers(self, rolling_back: bool = False) -> None:
        """An optimizer built from a constant keeps the value it was built with.

        Saving: the value before the save. Rolling back (called before the constants are put back): the
        rolled-back value, which a rebuild since may have built an optimizer with."""
        changes = {}
        for rebind in self.rebinds:
            for name, old in rebind._saved.items():
                new = rebind.namespace.get(name)
                if isinstance(old, (int, float)) and not isinstance(old, bool) and isinstance(new, (int, float)) and old != new:
                    changes[name] = (new, old) if rolling_back else (old, new)
        if not changes:
            return
        _, namespaces = split_roots(self.roots)
        for path, opt in _optimizers(self.roots):
            for i, group in enumerate(opt.param_groups):
                for name, (old, new) in changes.items():
                    equal = [key for key, value in group.items() if isinstance(value, float) and value == old]
                    # AdamW's default weight_decay is 0.01, like many an LR: when a hyperparameter's name is part
                    # of the constant's (lr in LR, BASE_LR), only that one is meant.
                    named = [key for key in equal if key.lower() in name.lower().split("_")]
                    for key in named or equal:
                        self.optimizer_constants.add(name)  # nor the note that setup() was built from it
                        if where_code_sets(namespaces, key) is not None:
                            continue  # the project sets param_groups' value itself (a schedule): no false "keeps"
                        self.notes.append(
                            f"{path} was built with {name} = {old!r} (param_groups[{i}][{key!r}]): it keeps "
                            f"that value, as no code of the project sets [{key!r}]; to use the "
                            f"{'rolled-back-to' if rolling_back else 'new'} {new!r}, set it in step() "
                            f"(`for group in opt.param_groups: group[{key!r}] = {name}`) or rebuild (R)"
                        )

    def undo(self) -> None:
        """Give back the old code: to the closures patched at commit, and, when the training thread
        set `roots` (a rollback), to closures made from the new code since (by a rebuild's setup())."""
        for ref, code in reversed(self._patched):
            fn = ref()
            if fn is not None:
                fn.__code__ = code
        self._patched = []
        self.notes = []
        if self.roots:
            self._revert_copies_made_since()
            self._note_optimizers(rolling_back=True)

    def _revert_copies_made_since(self) -> None:
        kept: list[str] = []
        captured: list[str] = []
        reverted = 0
        for path, obj in iter_live(self.roots):
            if isinstance(obj, types.FunctionType):
                name = code_name(obj.__code__)
                if "<locals>" not in name[1] or not self._runs_the_new_code(name, obj.__code__):
                    continue  # module functions and methods: their own patches give the old code back
                if obj.__code__.co_freevars and self._maker_changed(name):
                    captured.append(f"{path} ({name[1]})")
                old = self.changes.old.get(name)
                if old is None or old.co_freevars != obj.__code__.co_freevars:
                    kept.append(f"{path} ({name[1]})")
                    continue
                obj.__code__ = old
                reverted += 1
            elif isinstance(obj, types.GeneratorType) and obj.gi_frame is not None:
                name = code_name(obj.gi_code)
                if name in self.changes.changed and self._runs_the_new_code(name, obj.gi_code):
                    self.notes.append(
                        f"{path} is a running generator made by the rolled-back {name[1]}(): it keeps that code until "
                        "it is created again (R rebuilds)"
                    )
        if reverted:
            self.notes.append(f"gave the rolled-back code back to {reverted} live closure(s) made since")
        self._name_all(
            captured,
            "these live closures were made by the rolled-back code and keep the values it gave the variables they "
            "capture until R rebuilds them",
        )
        self._name_all(
            kept,
            "these live closures were made by the rolled-back code and cannot take the code before it (what they "
            "capture differs): they keep the newer code until R rebuilds them",
        )

    def _name_all(self, paths: list[str], sentence: str) -> None:
        """One note naming the live objects a sentence is about (the first five)."""
        if paths:
            self.notes.append(f"{sentence}: {', '.join(paths[:5])}")

    def _runs_the_new_code(self, name: CodeName, code: types.CodeType) -> bool:
        """Made from this version's code: that very object, or the same code at lines a later save moved
        (a rollback undoes those moved-only versions first)."""
        new = self.changes.new.get(name)
        if new is None:
            return False
        if new is code:
            return True
        old = self.changes.old.get(name)
        return same_content(new, code) and (old is None or not same_content(old, code))

    def _maker_changed(self, name: CodeName) -> bool:
        """Whether a function enclosing this code (`make_scale` of `make_scale.<locals>.f`) changed its own lines:
        then what a closure made by it captured may differ from what the code on disk would give it."""
        file, qualname = name
        parts = qualname.split(".<locals>.")
        return any((file, ".<locals>.".join(parts[:i])) in self.changes.own_changed for i in range(1, len(parts)))


def _optimizers(roots: list[Any]) -> Iterator[tuple[str, torch.optim.Optimizer]]:
    """The optimizers of the state, and those only a module global holds (`global optimizer`; one step() made)."""
    from workbench.engine.state_walk import find_with_globals

    state, namespaces = split_roots(roots)
    _, optimizers = find_with_globals(state, namespaces)
    yield from optimizers.items()
