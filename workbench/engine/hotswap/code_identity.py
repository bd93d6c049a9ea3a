"""One stable name for every piece of code: its file and qualified name.

A save replaces code objects; a line shift replaces them too (new line numbers).
A live closure or a running generator still holds whichever code object it was
made from, perhaps several saves ago. Matching live objects to new code by code
object identity therefore misses them after the first shift; matching by
`(file, qualified name)` (`make_scale.<locals>.f`, `GPT.forward`) does not.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any

CodeName = tuple[str, str]  # (co_filename, co_qualname)
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_COROUTINE


def code_name(code: types.CodeType) -> CodeName:
    return code.co_filename, getattr(code, "co_qualname", code.co_name)


def innermost(obj: Any) -> Any:
    """Follow functools.wraps chains to the function the user wrote."""
    seen = 0
    while hasattr(obj, "__wrapped__") and seen < 100:
        obj = obj.__wrapped__
        seen += 1
    return obj


def function_parts(attr: Any) -> list[Any]:
    """The functions inside a class attribute: a method, a static or class method's function, a property's."""
    if isinstance(attr, (staticmethod, classmethod)):
        return [attr.__func__]
    if isinstance(attr, property):
        return [f for f in (attr.fget, attr.fset, attr.fdel) if f is not None]
    return [attr] if isinstance(attr, types.FunctionType) else []


def without_lines(code: types.CodeType) -> types.CodeType:
    """The code with every line number and position removed: equal content compares equal."""
    consts = tuple(without_lines(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=1, co_linetable=b"", co_consts=consts)


def same_content(a: types.CodeType, b: types.CodeType) -> bool:
    return a is b or without_lines(a) == without_lines(b)


def same_own_content(a: types.CodeType, b: types.CodeType) -> bool:
    """Equal apart from the code nested in it: a factory whose own lines (what its closures capture) did not change."""

    def own(code: types.CodeType) -> types.CodeType:
        plain = without_lines(code)
        return plain.replace(co_consts=tuple(("<code>", code_name(c)[1]) if isinstance(c, types.CodeType) else c for c in plain.co_consts))

    return a is b or own(a) == own(b)


def walk_codes(code: types.CodeType) -> list[types.CodeType]:
    """The code and every code object defined inside it, depth first."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(walk_codes(const))
    return found


@dataclass
class CodeChanges:
    """What a reload makes of every function defined in the changed code, by stable name.

    `new`: the code each name runs from now on (moved-only code too, for right line numbers).
    `changed`: names whose content changed (a running generator of one keeps the old body).
    `ambiguous`: names defined twice in one scope (two lambdas): which new one is which old one
    cannot be told, so their live copies keep the old code, and say so.
    `old`: the code each name ran before, so a rollback can give it back to live copies made since.
    """

    new: dict[CodeName, types.CodeType] = field(default_factory=dict)
    old: dict[CodeName, types.CodeType] = field(default_factory=dict)
    # Names whose own lines changed, apart from code nested in them: a factory computing other values for its closures.
    own_changed: set[CodeName] = field(default_factory=set)
    changed: set[CodeName] = field(default_factory=set)
    ambiguous: set[CodeName] = field(default_factory=set)
    # Only nested code and generators can have live copies the patched function itself does not
    # reach; without them the walk over live objects is skipped (most saves edit a plain body).
    has_live_copies: bool = False

    def add(self, old: types.CodeType, new: types.CodeType) -> None:
        """Record a function whose live code `old` becomes `new`, with everything nested in it."""
        olds: dict[CodeName, list[types.CodeType]] = {}
        news: dict[CodeName, list[types.CodeType]] = {}
        for code in walk_codes(old):
            olds.setdefault(code_name(code), []).append(code)
        for code in walk_codes(new):
            news.setdefault(code_name(code), []).append(code)
        for name, codes in news.items():
            before = olds.get(name, [])
            if len(codes) > 1 or len(before) > 1:
                if len(codes) != len(before) or not all(map(same_content, codes, before)):
                    self.ambiguous.add(name)
                continue
            self.new[name] = codes[0]
            if before:
                self.old[name] = before[0]
            if before and not same_content(before[0], codes[0]):
                self.changed.add(name)
                if not same_own_content(before[0], codes[0]):
                    self.own_changed.add(name)
        for name in olds.keys() - news.keys():
            self.changed.add(name)  # removed from its function: a live copy runs code no longer on disk
        top_is_generator = bool(old.co_flags & _GENERATOR_FLAGS) and code_name(old) in self.changed
        if len(olds) > 1 or len(news) > 1 or top_is_generator:
            self.has_live_copies = True
