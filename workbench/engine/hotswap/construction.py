"""Which module constants, and which functions, the live state was built from.

`setup()` ran once, and what it built (a model with `n_layer` blocks, an optimizer with
`weight_decay`) keeps the values the constants had then, and what the functions it called
(`load_train_objs()`, a model builder) made with the code they had then. Re-binding such a
constant, or patching such a function, on a save changes what runs next, not what was built:
the reload must say so. This follows `setup()` through the functions and the constructors of
the classes (the globals their code loads) of the constant's module, or of every project module
for a function, and through the methods it calls by name (`trainer.prepare()`,
`GPT.get_default_config()`: minGPT, ported, whose edited `configure_optimizers` kept its old
learning rate with no note) when a class of those modules defines them. A function setup() only
hands on (`trainer.set_callback(on_batch_end)`) is not called by it: an edit of it is not said to
leave anything built with the old code.
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_MAX_FUNCTIONS = 200  # a bound on the walk through what setup() calls
_CONSTRUCTORS = ("__init__", "__post_init__")


# Handed to one of these, a function runs later, not while setup() builds: LambdaLR's warm-up lambda reads WARMUP at
# each scheduler step, a DataLoader's collate_fn at each batch, a hook or a callback when it fires. Anything else a
# function is handed to may call it at once (`model.apply(init_weights)`, a builder of the project's), so it counts
# as run: a false "built with" note costs a needless rebuild, a missing one a run that differs unsaid.
_RUNS_IT_LATER = frozenset({"LambdaLR", "MultiplicativeLR", "DataLoader", "Thread", "Timer"})
_LATER_PREFIXES = ("register", "on_")
_LATER_SUFFIXES = ("callback", "callbacks", "hook", "hooks")
_CALLS = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")
_STATEMENT_ENDS = ("POP_TOP", "RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE")
_SCAN_BACK = 64  # instructions: how far back the call an argument is handed to is looked for

# From 3.11 a callable is loaded with the NULL (or self) a call needs, which tells a call from a hand-over; 3.10 does
# not, and there every function setup() reaches counts as run, as it always did.
_CALLS_MARKED = sys.version_info >= (3, 11)


@functools.lru_cache(maxsize=4096)
def _instructions(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    """A code object's instructions, read once: a reload's planning walks the same functions several times (setup(),
    then each class's constructors)."""
    return tuple(dis.get_instructions(code))


def _runs_it_later(callee: str | None) -> bool:
    if callee is None:
        return False
    lowered = callee.lower()
    return callee in _RUNS_IT_LATER or lowered.startswith(_LATER_PREFIXES) or lowered.endswith(_LATER_SUFFIXES)


def _callee_loaded(instructions: Sequence[dis.Instruction], at: int) -> tuple[bool, str | None]:
    """Whether the instruction at `at` loads something to be called, and its name: a global or method loaded with its
    NULL or self, or a local after (3.11-3.12) or before (3.13) a PUSH_NULL."""
    instruction = instructions[at]
    op, flag = instruction.opname, (instruction.arg or 0) & 1
    if (op == "LOAD_GLOBAL" and flag) or op == "LOAD_METHOD" or (op == "LOAD_ATTR" and flag and sys.version_info >= (3, 12)):
        return True, instruction.argval
    if op == "PUSH_NULL":
        near = instructions[at - 1] if sys.version_info >= (3, 13) and at else \
            (instructions[at + 1] if at + 1 < len(instructions) else None)
        return True, (near.argval if near is not None and isinstance(near.argval, str) else None)
    return False, None


def _handed_to(instructions: Sequence[dis.Instruction], at: int) -> str | None:
    """The name of the call that what is loaded at `at` is an argument of, looking back through the arguments before
    it (skipping the calls made among them); None when it is no argument (an assignment, a return) or not known."""
    pending = 0
    for back in range(at - 1, max(at - _SCAN_BACK, 0) - 1, -1):
        instruction = instructions[back]
        if instruction.opname in _CALLS:
            pending += 1
        elif instruction.opname.startswith("STORE_") or instruction.opname in _STATEMENT_ENDS:
            return None
        else:
            is_callee, name = _callee_loaded(instructions, back)
            if is_callee:
                if pending == 0:
                    return name
                pending -= 1
    return None


def _loaded_names(instruction: dis.Instruction) -> tuple[str, ...]:
    """The local, cell or global names an instruction loads (3.13's pairs load two)."""
    op, value = instruction.opname, instruction.argval
    if op == "STORE_FAST_LOAD_FAST":
        value = value[-1:] if isinstance(value, tuple) else value
    elif not (op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF")
              or op.startswith("LOAD_FAST")):
        return ()
    names = value if isinstance(value, tuple) else (value,)
    return tuple(name for name in names if isinstance(name, str))


@functools.lru_cache(maxsize=4096)
def _only_handed_on(code: types.CodeType) -> frozenset[str]:
    """Names (globals, locals, cells, attributes) the code, and the code nested in it, loads only to hand to something
    that runs them later (`_runs_it_later`): a callback, a LambdaLR's lambda, a collate_fn."""
    if not _CALLS_MARKED:
        return frozenset()
    later: set[str] = set()
    now: set[str] = set()
    stored: dict[str, set[str]] = {}  # attribute -> the names stored under it (`self.update_fn = update_fn`)
    called: set[str] = set()  # attributes called (`self.update_fn(p)`): what was stored there runs now
    for each in _with_nested(code):
        instructions = _instructions(each)
        for at, instruction in enumerate(instructions):
            is_callee, callee = _callee_loaded(instructions, at)
            if is_callee and instruction.opname in ("LOAD_METHOD", "LOAD_ATTR") and callee is not None:
                called.add(callee)
            names = _loaded_names(instruction)
            if not names and instruction.opname == "LOAD_ATTR" and isinstance(instruction.argval, str):
                names = (instruction.argval,)
            if not names:
                continue
            into = None if is_callee else _stored_into_an_object(instructions, at)
            handed_later = not is_callee and (_runs_it_later(_handed_to(instructions, at)) or into is not None)
            (later if handed_later else now).update(names)
            if into:
                stored.setdefault(into, set()).update(names)
    for attribute in called & set(stored):
        now.update(stored[attribute])
    return frozenset(later - now)


# What may come between a value loaded and its store into an object: the object, and a key (`self.fns['step']`).
_TARGET_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_DEREF", "LOAD_CONST", "LOAD_SMALL_INT",
                 "LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR")


def _stored_into_an_object(instructions: Sequence[dis.Instruction], at: int) -> str | None:
    """The attribute (or "" for an item) what is loaded at `at` is stored straight into (`self.update_fn =
    update_fn`: lion-pytorch's `Lion.__init__`), not called, else None: the live object keeps the function, whose code
    a save replaces in place, so it runs the new code at its next call; unless the same code calls that attribute
    (`self.update_fn(p)`, see `_only_handed_on`). A store into a local is not this: it may be called later."""
    for after in range(at + 1, min(at + 6, len(instructions))):
        instruction = instructions[after]
        if instruction.opname == "STORE_ATTR":
            return str(instruction.argval)
        if instruction.opname == "STORE_SUBSCR":
            return ""
        if instruction.opname not in _TARGET_LOADS or _callee_loaded(instructions, after)[0]:
            return None  # anything else, or something loaded to be called: `self.made = f(update_fn)`
    return None


def _with_nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _with_nested(const)


@functools.lru_cache(maxsize=4096)
def _nested_run_at_once(code: types.CodeType) -> tuple[types.CodeType, ...]:
    """The code nested in `code` that may run while it runs: all of it (comprehensions, inner functions, lambdas,
    class bodies), but a lambda or inner function only handed to what runs it later (LambdaLR's warm-up lambda, a
    `collate_fn`), which reads its globals each time it runs: an edited WARMUP is what the live lambda reads next."""
    nested = tuple(const for const in code.co_consts if isinstance(const, types.CodeType))
    if not nested or not _CALLS_MARKED:
        return nested
    instructions = _instructions(code)
    handed_on = _only_handed_on(code)
    run: list[types.CodeType] = []
    for at, instruction in enumerate(instructions):
        made = instruction.argval
        if instruction.opname != "LOAD_CONST" or not isinstance(made, types.CodeType):
            continue
        if _runs_it_later(_handed_to(instructions, at)):
            continue  # made as the argument of what runs it later: `LambdaLR(opt, lambda s: ...)`
        if _stored_as(instructions, at) in handed_on:
            continue  # stored, then only handed on: `def collate(b): ...; DataLoader(ds, collate_fn=collate)`
        run.append(made)
    return tuple(run)


def _stored_as(instructions: Sequence[dis.Instruction], at: int) -> str | None:
    """The name a function made from the code loaded at `at` is stored under straight away (`def collate`, `f =
    lambda ...`), or None (handed to a call, decorated)."""
    after = at + 1
    while after < len(instructions) and instructions[after].opname in ("MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE"):
        after += 1
    if after < len(instructions) and instructions[after].opname.startswith("STORE_"):
        name = instructions[after].argval
        return name if isinstance(name, str) else None
    return None


def _globals_loaded(code: types.CodeType) -> Iterator[str]:
    """Names the code (and code nested in it that may run with it) loads as globals: `n_layer`, not
    `config.n_layer`."""
    for instruction in _instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(instruction.argval, str):
            yield instruction.argval
    for nested in _nested_run_at_once(code):
        yield from _globals_loaded(nested)


@dataclass(frozen=True)
class _Uses:
    """How a function's code uses the names it loads, for the walk."""

    handed_on: frozenset[str]  # loaded only to be handed to what runs them later: not run by this code
    attributes: frozenset[str]  # attribute names loaded: its method calls (`x.prepare()`) are among them
    owners: dict[str, frozenset[str]]  # globals loaded only to read an attribute of: `Net.from_config`, `Config.LR`


@functools.lru_cache(maxsize=4096)
def _uses(code: types.CodeType) -> _Uses:
    attributes: set[str] = set()
    owner_of: dict[str, set[str]] = {}
    not_owner: set[str] = set()
    for each in [code, *_nested_run_at_once_all(code)]:
        instructions = _instructions(each)
        for instruction, after in zip(instructions, (*instructions[1:], None)):
            name = instruction.argval
            if not isinstance(name, str):
                continue
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(after.argval, str):
                    owner_of.setdefault(name, set()).add(after.argval)
                else:
                    not_owner.add(name)
            elif instruction.opname in ("LOAD_METHOD", "LOAD_ATTR"):
                # Any attribute: a call with *args or **kwargs (and on 3.10 with keywords) loads it as a plain attribute
                # (`_methods_by_name` leaves out the names a library's object has).
                attributes.add(name)
    handed_on = _only_handed_on(code)
    owners = {name: frozenset(read) for name, read in owner_of.items() if name not in not_owner}
    return _Uses(handed_on, frozenset(attributes - handed_on), owners)


def _nested_run_at_once_all(code: types.CodeType) -> Iterator[types.CodeType]:
    for nested in _nested_run_at_once(code):
        yield nested
        yield from _nested_run_at_once_all(nested)


def _builds(value: Any, name: str, uses: _Uses) -> bool:
    """Whether loading `name` (a function or class of the project) runs it: not when only handed to what runs it
    later, nor for a class only read an attribute of (`Config.LR`, a static helper), unless that attribute is a
    classmethod, which may well build one (`Net.from_config(cfg)`)."""
    if name in uses.handed_on:
        return False
    read = uses.owners.get(name)
    if read is not None and isinstance(value, type):
        return any(isinstance(inspect.getattr_static(value, attribute, None), classmethod) for attribute in read)
    return True


@functools.cache
def _library_method_names() -> frozenset[str]:
    """Method names a call may well mean on a library's object (`model.train()`, `opt.step()`, `d.update()`): not
    followed into a project class's method of the same name, which setup() most likely did not call."""
    import torch

    kinds = (object, dict, list, set, str, bytes, torch.nn.Module, torch.optim.Optimizer, torch.Tensor,
             torch.utils.data.DataLoader, torch.utils.data.Dataset, torch.optim.lr_scheduler.LRScheduler)
    return frozenset(name for kind in kinds for name in dir(kind))


def _methods_by_name(modules: frozenset[str]) -> dict[str, list[tuple[str, types.FunctionType]]]:
    """Every method of the classes `modules` define at their top, by name: (its qualified name, its function); none
    whose name a library's object has too (`_library_method_names`)."""
    library = _library_method_names()
    found: dict[str, list[tuple[str, types.FunctionType]]] = {}
    for module_name in modules:
        module = sys.modules.get(module_name)
        for value in list(vars(module).values()) if module is not None else ():
            if not isinstance(value, type) or value.__module__ != module_name:
                continue
            for name, member in vars(value).items():
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(fn, types.FunctionType) and not name.startswith("__") and name not in library:
                    found.setdefault(name, []).append((fn.__qualname__, fn))
    return found


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


def _walk(start: Any, modules: frozenset[str]) -> Iterator[tuple[str, types.CodeType, list[str], dict[str, Any], bool]]:
    """What `start` (setup(), or a class: its constructors) runs, followed through the functions and classes of
    `modules` that its code loads as globals, and the methods of their classes it calls by name: (the chain of calls
    to it, its code, the globals it loads, their namespace, whether the chain calls it: False for a function only
    handed on, a callback, which may run later), breadth first, within a bound."""
    seen: dict[tuple[str, str], bool] = {}
    methods: dict[str, list[tuple[str, types.FunctionType]]] | None = None
    queue: list[tuple[str, Any, bool]] = [(getattr(start, "__qualname__", "?"), start, True)]
    while queue and len(seen) < _MAX_FUNCTIONS:
        chain, obj, called = queue.pop(0)
        for label, code, namespace in _code_of(obj):
            key = (namespace.get("__name__", ""), label)
            if key in seen and (seen[key] or not called):
                continue
            seen[key] = called
            chain_here = chain if chain.endswith(label) else f"{chain} -> {label}"
            loaded = list(dict.fromkeys(_globals_loaded(code)))
            yield chain_here, code, loaded, namespace, called
            uses = _uses(code)
            for name in loaded:
                value = namespace.get(name)
                if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) in modules \
                        and not _runs_later(value):
                    queue.append((chain_here, value, called and _builds(value, name, uses)))
            if uses.attributes and methods is None:
                methods = _methods_by_name(modules)
            for name in sorted(uses.attributes):
                for _, fn in (methods or {}).get(name, ()):
                    if not _runs_later(fn):
                        queue.append((chain_here, fn, called))


def constants_read_when_built(namespace: dict[str, Any], constants: Iterable[str], start: Any) -> dict[str, list[str]]:
    """For each constant, the chains of code from `start` (setup(), or a class: its constructors) that read it,
    following the module's own functions and classes: {"n_layer": ["setup -> MLP.__init__"]}."""
    wanted = set(constants)
    if not wanted or start is None:
        return {}
    found: dict[str, list[str]] = {}
    for chain, _, loaded, _, called in _walk(start, frozenset({namespace.get("__name__", "")})):
        if not called:
            continue  # a callback setup() only hands on reads its constants when it runs, later
        for name in loaded:
            if name in wanted:
                found.setdefault(name, []).append(chain)
    return found


def functions_called_when_built(changed: Iterable[types.FunctionType], start: Any, modules: Iterable[str]) -> dict[str, str]:
    """Of the `changed` functions, those `start` (setup()) calls, directly or through the project's functions and
    constructors (`modules`), each with the chain that reaches it: {"load_train_objs": "setup -> load_train_objs"}.
    What setup() built with them is the old code's result until a rebuild. Generator functions are left out: the
    running generator's own note says so."""
    wanted = {fn.__code__: fn.__qualname__ for fn in changed if not fn.__code__.co_flags & inspect.CO_GENERATOR}
    if not wanted or start is None:
        return {}
    return {wanted[code]: chain for chain, code, _, _, called in _walk(start, frozenset(modules))
            if code in wanted and called}


def globals_read_by(start: Any, namespace: dict[str, Any], modules: Iterable[str]) -> list[str]:
    """The globals of `namespace` that `start` (a function, or a class: its constructors) reads when called,
    through the project's functions and constructors (`modules`): inputs a call's arguments do not show
    (`RNNModel(ntokens)` whose `__init__` reads the script's `args`)."""
    found: dict[str, None] = {}
    for _, _, loaded, where, _ in _walk(start, frozenset(modules)):
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
