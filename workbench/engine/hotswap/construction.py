"""Which module constants, and which functions, the live state was built from.

`setup()` ran once, and what it built (a model with `n_layer` blocks, an optimizer with
`weight_decay`) keeps the values the constants had then, and what the functions it called
(`load_train_objs()`, a model builder) made with the code they had then. Re-binding such a
constant, or patching such a function, on a save changes what runs next, not what was built:
the reload must say so. This follows `setup()` through the functions and the constructors of
the classes (the globals their code loads) of the constant's module, or of every project module
for a function.
"""

from __future__ import annotations

import dis
import inspect
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


def _code_of(obj: Any) -> Iterator[tuple[str, types.CodeType, dict[str, Any]]]:
    """(label, code, the globals it runs with) of a function, or of a class's constructors."""
    fn = getattr(obj, "__wrapped__", obj)
    if isinstance(fn, types.FunctionType):
        yield fn.__qualname__, fn.__code__, fn.__globals__
    elif isinstance(obj, type):
        for name in _CONSTRUCTORS:
            member = obj.__dict__.get(name)
            if isinstance(member, types.FunctionType):
                yield member.__qualname__, member.__code__, member.__globals__


_RUNS_LATER = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _runs_later(obj: Any) -> bool:
    """A generator (or coroutine) function: calling it in setup() only makes the generator; its body, and all it
    calls and reads, runs at each `next()`, with the values of then (tiny_gpt's `batches()` reads BATCH_SIZE
    every batch), so nothing setup() built comes from it."""
    fn = getattr(obj, "__wrapped__", obj)
    return isinstance(fn, types.FunctionType) and bool(fn.__code__.co_flags & _RUNS_LATER)


def _walk(start: Any, modules: frozenset[str]) -> Iterator[tuple[str, types.CodeType, list[str], dict[str, Any]]]:
    """What `start` (setup(), or a class: its constructors) runs, followed through the functions and classes of
    `modules` that its code loads as globals: (the chain of calls to it, its code, the globals it loads, their
    namespace), breadth first, within a bound."""
    seen: set[tuple[str, str]] = set()
    queue: list[tuple[str, Any]] = [(getattr(start, "__qualname__", "?"), start)]
    while queue and len(seen) < _MAX_FUNCTIONS:
        chain, obj = queue.pop(0)
        for label, code, namespace in _code_of(obj):
            if (namespace.get("__name__", ""), label) in seen:
                continue
            seen.add((namespace.get("__name__", ""), label))
            chain_here = chain if chain.endswith(label) else f"{chain} -> {label}"
            loaded = list(dict.fromkeys(_globals_loaded(code)))
            yield chain_here, code, loaded, namespace
            for name in loaded:
                value = namespace.get(name)
                if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) in modules \
                        and not _runs_later(value):
                    queue.append((chain_here, value))


def constants_read_when_built(namespace: dict[str, Any], constants: Iterable[str], start: Any) -> dict[str, list[str]]:
    """For each constant, the chains of code from `start` (setup(), or a class: its constructors) that read it,
    following the module's own functions and classes: {"n_layer": ["setup -> MLP.__init__"]}."""
    wanted = set(constants)
    if not wanted or start is None:
        return {}
    found: dict[str, list[str]] = {}
    for chain, _, loaded, _ in _walk(start, frozenset({namespace.get("__name__", "")})):
        for name in loaded:
            if name in wanted:
                found.setdefault(name, []).append(chain)
    return found


def functions_called_when_built(changed: Iterable[types.FunctionType], start: Any, modules: Iterable[str]) -> dict[str, str]:
    """Of the `changed` functions, those `start` (setup()) calls, directly or through the project's functions and
    constructors (`modules`), each with the chain that reaches it: {"load_train_objs": "setup -> load_train_objs"}.
    What setup() built with them is the old code's result until a rebuild. Generator functions are left out: the
    running generator's own note says so."""
    wanted = {fn.__code__: fn.__name__ for fn in changed if not fn.__code__.co_flags & inspect.CO_GENERATOR}
    if not wanted or start is None:
        return {}
    return {wanted[code]: chain for chain, code, _, _ in _walk(start, frozenset(modules)) if code in wanted}


def globals_read_by(start: Any, namespace: dict[str, Any], modules: Iterable[str]) -> list[str]:
    """The globals of `namespace` that `start` (a function, or a class: its constructors) reads when called,
    through the project's functions and constructors (`modules`): inputs a call's arguments do not show
    (`RNNModel(ntokens)` whose `__init__` reads the script's `args`)."""
    found: dict[str, None] = {}
    for _, _, loaded, where in _walk(start, frozenset(modules)):
        if where is namespace:
            found.update(dict.fromkeys(loaded))
    return list(found)


def called_by_setup_note(name: str, chain: str, rolled_back: bool = False) -> str:
    """The log's sentence for a changed function setup() called to build the live state, after a save or a rollback."""
    if rolled_back:
        return (f"{name} was called when setup() built the live state ({chain}) with the rolled-back code: what it "
                "built keeps what that code made; R (command `rebuild`) builds it again with the code before")
    return (f"{name} is called by setup() ({chain}): what setup() built with it keeps what the old code made; "
            "R (command `rebuild`) builds it again with the new code")


def constructor_read_note(class_name: str, names: tuple[str, ...], rolled_back: bool = False) -> str:
    """The log's sentence for re-bound constants a class's constructor read, after a save or a rollback (whose
    rebuild since built the live instances with the rolled-back value)."""
    read = f"{', '.join(names)} {'was' if len(names) == 1 else 'were'} read by {class_name}'s constructor"
    if rolled_back:
        return (f"{read} when R built the live state with the rolled-back value: its instances keep what that value "
                "built; R (command `rebuild`) builds them again with the value before")
    return f"{read}: live instances keep what the old value built; R (command `rebuild`) builds them again"


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
