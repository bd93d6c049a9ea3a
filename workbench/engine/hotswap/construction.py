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
from collections.abc import Iterable, Iterator
from typing import Any

_MAX_FUNCTIONS = 200  # a bound on the walk through what setup() calls
_CONSTRUCTORS = ("__init__", "__post_init__")


_RUN_WHERE_WRITTEN = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
_CALLED_AS_MADE = ("LOAD_BUILD_CLASS", "PUSH_NULL")  # 3.13 pushes the NULL after the function is made
_STORES = ("STORE_FAST", "STORE_DEREF", "STORE_NAME", "STORE_GLOBAL")


def _nested_run_at_once(code: types.CodeType) -> Iterator[types.CodeType]:
    """The code nested in `code` that runs while it runs: a comprehension, a function it defines and calls, or hands to
    `model.apply`. Not a lambda or function it only hands on (LambdaLR's warm-up lambda, a `collate_fn`): that reads
    its globals each time it runs, later, so an edited WARMUP is what the live lambda reads next. Before 3.11 a call
    is not told from a hand-over: all of it, as before."""
    nested = [const for const in code.co_consts if isinstance(const, types.CodeType)]
    if not nested or not _CALLS_MARKED:
        yield from nested
        return
    instructions = list(dis.get_instructions(code))
    called = _local_functions_called(instructions)
    for comprehension in nested:  # 3.11 runs a comprehension as code of its own: `[block(i) for i in ...]` calls there
        if comprehension.co_name in _RUN_WHERE_WRITTEN:
            called |= _local_functions_called(list(dis.get_instructions(comprehension)))
    for at, instruction in enumerate(instructions):
        made = instruction.argval
        if instruction.opname != "LOAD_CONST" or not isinstance(made, types.CodeType):
            continue
        before = _before_closure(instructions, at)
        made_then = instructions[at + 2] if at + 2 < len(instructions) else None
        if made.co_name in _RUN_WHERE_WRITTEN or (before is not None and before.opname in _CALLED_AS_MADE) \
                or (made_then is not None and made_then.opname == "PUSH_NULL"):
            yield made  # a class body, `(lambda: ...)()`: run where written
        elif made.co_name == "<lambda>":
            if _handed_to_a_caller(before):
                yield made
        else:
            stored = next((later.argval for later in instructions[at + 1:at + 6] if later.opname in _STORES), None)
            if stored is None or stored in called:  # a decorated or otherwise unusual def: as before, it runs
                yield made


def _local_functions_called(instructions: list[dis.Instruction]) -> set[str]:
    """Local names the code calls (3.11-3.12 push NULL before loading one to call, 3.13 after) or hands to
    `model.apply`."""
    called: set[str] = set()
    for at, instruction in enumerate(instructions):
        name = _local_loaded(instruction)
        if name is None:
            continue
        before = instructions[at - 1] if at else None
        after = instructions[at + 1] if at + 1 < len(instructions) else None
        if (before is not None and before.opname == "PUSH_NULL") or (after is not None and after.opname == "PUSH_NULL") \
                or _handed_to_a_caller(before):
            called.add(name)
    return called


def _local_loaded(instruction: dis.Instruction) -> str | None:
    """The local (or cell) name an instruction leaves on top of the stack: LOAD_FAST and its variants, and 3.13's
    pairs (`STORE_FAST_LOAD_FAST (i, block)` loads `block`)."""
    if instruction.opname == "LOAD_DEREF" or instruction.opname.startswith("LOAD_FAST") \
            or instruction.opname == "STORE_FAST_LOAD_FAST":
        name = instruction.argval
        if isinstance(name, tuple):
            name = name[-1] if name else None
        return name if isinstance(name, str) else None
    return None


def _before_closure(instructions: list[dis.Instruction], at: int) -> dis.Instruction | None:
    """The instruction before a nested function's code is loaded, past the tuple of cells a closure is made with."""
    at -= 1
    if at >= 0 and instructions[at].opname == "BUILD_TUPLE":
        at -= 1 + (instructions[at].arg or 0)
    return instructions[at] if at >= 0 else None


def _globals_loaded(code: types.CodeType) -> Iterator[str]:
    """Names the code (and code nested in it) loads as globals: `n_layer`, not `config.n_layer`."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(instruction.argval, str):
            yield instruction.argval
    for nested in _nested_run_at_once(code):
        yield from _globals_loaded(nested)


# From 3.11 a global loaded to be called has its low bit set (the NULL pushed for the call); before, every global
# loaded counts as called, as it always did.
_CALLS_MARKED = sys.version_info >= (3, 11)


# Handed as the first argument to one of these, a function runs before the call returns: `model.apply(init_weights)`
# initializes the model with it in setup(), where a callback handed to `register(on_batch)` runs later.
_CALL_AT_ONCE = frozenset({"apply", "map", "filter", "sorted"})


def _handed_to_a_caller(before: dis.Instruction | None) -> bool:
    return before is not None and before.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL") \
        and before.argval in _CALL_AT_ONCE


def _attribute_called(after: dis.Instruction | None) -> bool:
    """3.11 and 3.12 mark the global of `Cls.m(**kw)` (a call through CALL_FUNCTION_EX) as called: what is called
    is its attribute, when one is loaded straight after it."""
    return after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD")


def _calls(code: types.CodeType) -> tuple[set[str], set[str]]:
    """The globals the code (and code nested in it) calls, and the attribute names it loads, which its method calls
    (`x.prepare()`) are among."""
    functions: set[str] = set()
    methods: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for before, instruction, after in zip([None, *instructions], instructions, instructions[1:] + [None]):
        name = instruction.argval
        if not isinstance(name, str):
            continue
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            if not _CALLS_MARKED or instruction.opname == "LOAD_NAME" or _handed_to_a_caller(before) or (
                    (instruction.arg or 0) & 1 and not _attribute_called(after)):
                functions.add(name)
        elif instruction.opname in ("LOAD_METHOD", "LOAD_ATTR"):
            # Any attribute: a call with *args or **kwargs (and on 3.10 with keywords) loads it as a plain attribute
            # (`_methods_by_name` leaves out the names a library's object has).
            methods.add(name)
    for nested in _nested_run_at_once(code):
        more, more_methods = _calls(nested)
        functions |= more
        methods |= more_methods
    return functions, methods


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
            calls, method_names = _calls(code)
            for name in loaded:
                value = namespace.get(name)
                if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) in modules \
                        and not _runs_later(value):
                    queue.append((chain_here, value, called and name in calls))
            if method_names and methods is None:
                methods = _methods_by_name(modules)
            for name in sorted(method_names):
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
