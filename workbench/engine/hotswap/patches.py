"""The edits a reload makes to live objects, each one undoable.

They run on the training thread between steps. If one fails, the ones already
applied are undone in reverse order, so a reload is all or nothing.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

_MISSING: Any = object()


class Patch:
    """One in-place edit; `apply` remembers what `undo` needs."""

    def apply(self) -> None:
        raise NotImplementedError

    def undo(self) -> None:
        raise NotImplementedError


@dataclass
class ReplaceCode(Patch):
    """Give an existing function new code and defaults: every holder of a reference sees it.

    It keeps the new function's parts, not the function: a function planned in a scratch copy of
    the module has that copy as its globals, and the history would keep every value in it alive
    (a model in a module global, one more per rebuild).
    """

    target: types.FunctionType
    code: types.CodeType
    defaults: tuple[Any, ...] | None = None
    kwdefaults: dict[str, Any] | None = None
    doc: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    moved_only: bool = False  # same code at new line numbers (tracebacks stay right)
    _saved: tuple[Any, ...] = field(default=(), init=False)

    @classmethod
    def taking(cls, target: types.FunctionType, new: types.FunctionType, *, moved_only: bool = False) -> ReplaceCode:
        """The patch that makes `target` run what `new` runs."""
        return cls(target, new.__code__, new.__defaults__, new.__kwdefaults__, new.__doc__, dict(new.__annotations__), moved_only)

    def apply(self) -> None:
        t = self.target
        self._saved = (t.__code__, t.__defaults__, t.__kwdefaults__, t.__doc__, dict(t.__annotations__))
        t.__code__ = self.code
        t.__defaults__ = self.defaults
        t.__kwdefaults__ = self.kwdefaults
        t.__doc__ = self.doc
        t.__annotations__ = dict(self.annotations)

    def undo(self) -> None:
        t = self.target
        t.__code__, t.__defaults__, t.__kwdefaults__, t.__doc__, t.__annotations__ = self._saved


@dataclass
class ShiftLines(Patch):
    """Code that only moved: same code at new line numbers, nested functions included."""

    targets: list[types.FunctionType]
    shift: int
    _saved: list[types.CodeType] = field(default_factory=list, init=False)

    def apply(self) -> None:
        self._saved = [t.__code__ for t in self.targets]
        for target in self.targets:
            target.__code__ = shift_code(target.__code__, self.shift)

    def undo(self) -> None:
        for target, code in zip(self.targets, self._saved):
            target.__code__ = code


def shift_code(code: types.CodeType, shift: int) -> types.CodeType:
    consts = tuple(shift_code(c, shift) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=max(code.co_firstlineno + shift, 1), co_consts=consts)


@dataclass
class RunInNamespace(Patch):
    """Run one precompiled statement in the live module (new defs, constants, imports)."""

    code: types.CodeType
    namespace: dict[str, Any]
    binds: tuple[str, ...]
    _saved: dict[str, Any] = field(default_factory=dict, init=False)

    def apply(self) -> None:
        self._saved = {name: self.namespace.get(name, _MISSING) for name in self.binds}
        exec(self.code, self.namespace)  # noqa: S102 - the user's own source, compiled in prepare

    def undo(self) -> None:
        for name, value in self._saved.items():
            if value is _MISSING:
                self.namespace.pop(name, None)
            else:
                self.namespace[name] = value


@dataclass
class SetAttribute(Patch):
    """Set (or with value=_MISSING, delete) an attribute of a live class."""

    owner: Any
    attribute: str
    value: Any
    _saved: Any = field(default=_MISSING, init=False)

    def apply(self) -> None:
        self._saved = self.owner.__dict__.get(self.attribute, _MISSING)
        if self.value is _MISSING:
            if self._saved is not _MISSING:
                delattr(self.owner, self.attribute)
        else:
            setattr(self.owner, self.attribute, self.value)

    def undo(self) -> None:
        if self._saved is _MISSING:
            if self.attribute in self.owner.__dict__:
                delattr(self.owner, self.attribute)
        else:
            setattr(self.owner, self.attribute, self._saved)


@dataclass
class ReplaceReferences(Patch):
    """After a name was defined again, point other modules' references to the old object at the new one.

    `from model import Block` in train.py holds the class object itself; without this, code
    there (setup() in a rebuild, say) would keep building the old class.
    """

    namespaces: list[dict[str, Any]]
    old: Any
    source: dict[str, Any]
    name: str
    _changed: list[tuple[dict[str, Any], str]] = field(default_factory=list, init=False)

    def apply(self) -> None:
        new = self.source.get(self.name, _MISSING)
        self._changed = []
        if new is _MISSING or new is self.old:
            return
        for namespace in self.namespaces:
            for key, value in list(namespace.items()):
                if value is self.old:
                    namespace[key] = new
                    self._changed.append((namespace, key))

    def undo(self) -> None:
        for namespace, key in self._changed:
            namespace[key] = self.old


DELETE = _MISSING


def apply_all(patches: list[Patch]) -> None:
    """Apply in order; on any failure undo what was applied and re-raise."""
    done: list[Patch] = []
    try:
        for patch in patches:
            patch.apply()
            done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.undo()
        raise


def undo_all(patches: list[Patch]) -> None:
    for patch in reversed(patches):
        patch.undo()
