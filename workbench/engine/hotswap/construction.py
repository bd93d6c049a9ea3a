"""Which module constants the live state was built from.

`setup()` ran once, and what it built (a model with `n_layer` blocks, an optimizer with
`weight_decay`) keeps the values the constants had then. Re-binding such a constant on a
save changes what runs next, not what was built: the reload must say so. This follows
`setup()` through the module's functions and the constructors of its classes (the globals
their code loads), within the module the constant lives in.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Iterable, Iterator
from typing import Any

_MAX_FUNCTIONS = 200  # a bound on the walk through what setup() calls
_CONSTRUCTORS = ("__init__", "__post_init__")


def _globals_loaded(code: types.CodeType) -> Iterator[str]:
    """Names the code (and code nested in it) loads as globals: `n_layer`, not `config.n_layer`."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(instruction.argval, str):
            yield instruction.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _globals_loaded(const)


def _code_of(obj: Any) -> Iterator[tuple[str, types.CodeType]]:
    """(label, code) of a function, or of a class's constructors."""
    fn = getattr(obj, "__wrapped__", obj)
    if isinstance(fn, types.FunctionType):
        yield fn.__qualname__, fn.__code__
    elif isinstance(obj, type):
        for name in _CONSTRUCTORS:
            member = obj.__dict__.get(name)
            if isinstance(member, types.FunctionType):
                yield member.__qualname__, member.__code__


def constants_read_when_built(namespace: dict[str, Any], constants: Iterable[str], start: Any) -> dict[str, list[str]]:
    """For each constant, the chains of code from `start` (setup(), or a class: its constructors) that read it,
    following the module's own functions and classes: {"n_layer": ["setup -> MLP.__init__"]}."""
    wanted = set(constants)
    if not wanted or start is None:
        return {}
    found: dict[str, list[str]] = {}
    seen: set[str] = set()
    queue: list[tuple[str, Any]] = [(getattr(start, "__qualname__", "?"), start)]
    while queue and len(seen) < _MAX_FUNCTIONS:
        chain, obj = queue.pop(0)
        for label, code in _code_of(obj):
            if label in seen:
                continue
            seen.add(label)
            chain_here = chain if chain.endswith(label) else f"{chain} -> {label}"
            for name in dict.fromkeys(_globals_loaded(code)):
                if name in wanted:
                    found.setdefault(name, []).append(chain_here)
                value = namespace.get(name)
                if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == namespace.get("__name__"):
                    queue.append((chain_here, value))
    return found


def built_from_note(name: str, chains: list[str] | tuple[str, ...], rolled_back: bool = False) -> str:
    """The log's sentence for a constant setup() built the live state from, after a save or a rollback."""
    how = "; ".join(chains[:3])
    if rolled_back:
        return (
            f"{name} was read when setup() built the live state ({how}) with the rolled-back value: what it built "
            "keeps it; R (command `rebuild`) builds it again with the value before"
        )
    return (
        f"{name} was read when setup() built the live state ({how}): what it built keeps the old value; "
        "R (command `rebuild`) builds it again with the new one"
    )
