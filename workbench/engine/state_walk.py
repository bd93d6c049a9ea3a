"""Find the nn.Modules and optimizers inside whatever `setup` returned.

The user returns plain Python (a dict, a dataclass, an object); we look through
dict values, list/tuple items and object attributes, naming each find by its
path (`model`, `state.opt`), and count each object once.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

Namespaces = Iterable[tuple[str, dict[str, Any]]]  # (module name, its globals): where script-style trainers keep things

_MAX_DEPTH = 4
# Module globals that are code, not state: never walked (an imported module would lead into torch itself).
NOT_STATE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
_MAX_ITEMS = 256  # models and optimizers sit near the top of a state, not deep inside a dataset list
_GLOBALS_DEPTH = 2  # a module global and two levels inside it (`trainer.scheduler`): globals hold datasets too
# What a search for one kind of object (a scheduler, a loader) never goes into: code, tensors, and the model and
# optimizer (a scheduler or loader found inside them would not be named as setup() names it).
_WALK_STOPS = (type, types.ModuleType, torch.Tensor, torch.nn.Module, torch.optim.Optimizer)


def children(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """What every walk over the state goes into, each with its path: a dict's values and a list's or tuple's
    items (the first 256), an object's public attributes (not a class's, a module's, a tensor's or a callable's).
    The walks differ in what they look for and where they stop; this is how user state nests, for all of them."""
    if isinstance(obj, dict):
        for key, value in list(itertools.islice(obj.items(), _MAX_ITEMS)):
            yield (f"{path}.{key}" if path else str(key)), value
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(itertools.islice(obj, _MAX_ITEMS)):
            yield (f"{path}[{i}]" if path else f"[{i}]"), value
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, torch.Tensor)) and not callable(obj):
        for key, value in list(vars(obj).items()):
            if not key.startswith("_"):
                yield (f"{path}.{key}" if path else key), value


def top_values(state: Any) -> list[tuple[str, Any]]:
    """What setup() returned, one level down (`children`), each labelled as the user's code reaches it:
    `state['batches']`, `state[0]`, `state.loader`; a state of no kind `children` goes into is itself `state`."""
    if isinstance(state, dict):
        return [(f"state[{key!r}]", value) for key, value in itertools.islice(state.items(), _MAX_ITEMS)]
    found = [(f"state{path}" if path.startswith("[") else f"state.{path}", value) for path, value in children(state, "")]
    return found or [("state", state)]


def find_reachable(state: Any, namespaces: Namespaces, matches: Callable[[Any], bool], name: str, *,
                   stop_at: tuple[type, ...] = (), into_generators: bool = False) -> dict[str, Any]:
    """Every object `matches` accepts in the state and in the project's module globals (`train.scheduler`), each once,
    by its path (`name` for the state itself); the state's path wins. What LR schedulers and stateful loaders are
    looked for with, so a snapshot and its resume name each the same way. `stop_at` adds kinds not gone into;
    `into_generators` also looks at what a generator in the state was given (`batches(loader)`)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    search = dict(matches=matches, seen=seen, stop_at=stop_at, into_generators=into_generators)
    for path, obj in reachable(state, "", depth=0, **search):
        found.setdefault(path or name, obj)
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if not key.startswith("__") and not isinstance(value, NOT_STATE):
                for path, obj in reachable(value, f"{module_name}.{key}", depth=_MAX_DEPTH - _GLOBALS_DEPTH, **search):
                    found.setdefault(path, obj)
    return found


def reachable(obj: Any, path: str, *, matches: Callable[[Any], bool], seen: set[int], depth: int,
              stop_at: tuple[type, ...] = (), into_generators: bool = False) -> Iterator[tuple[str, Any]]:
    """(path, object) for what `matches` accepts from `obj` down, skipping what `seen` holds (and adding to it)."""
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    if matches(obj):
        yield path, obj
        return
    if isinstance(obj, _WALK_STOPS + stop_at):
        return
    inside = generator_inputs(obj, path) if isinstance(obj, types.GeneratorType) and into_generators else children(obj, path)
    for child_path, child in inside:
        yield from reachable(child, child_path, matches=matches, seen=seen, depth=depth + 1, stop_at=stop_at,
                             into_generators=into_generators)


def generator_inputs(generator: types.GeneratorType, path: str) -> list[tuple[str, Any]]:
    """A generator's arguments and the variables it closes over, by name: what it has before its first `next()`,
    so a resumed run's fresh generator names what it reads as the snapshotted one did (locals made inside it do not
    exist yet at a resume: they are not looked at)."""
    frame = generator.gi_frame
    if frame is None:
        return []
    code = generator.gi_code
    names = [*code.co_varnames[: code.co_argcount + code.co_kwonlyargcount], *code.co_freevars]
    values = frame.f_locals
    prefix = path or code.co_name
    return [(f"{prefix}({name})", values[name]) for name in names if name in values]


def find_modules_and_optimizers(state: Any) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
    """The models and optimizers of the state, by path. Inside a model, what it holds outside its registered
    children counts too: pytorch/examples' Forward-Forward `Net` keeps its layers in a plain list
    (`self.layers = []`) and each layer its own optimizer (`self.opt = Adam(...)`); a snapshot of that state kept
    neither, a resume said it had loaded everything, and a rebuild carried nothing, unsaid. They are found as
    `net.layers[0]` and `net.layers[0].opt`, after the rest of the state: an optimizer the state also holds keeps
    the state's name (`opt`, not `model.opt`)."""
    modules: dict[str, torch.nn.Module] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    seen: set[int] = set()
    inside: list[tuple[torch.nn.Module, str, int]] = []  # models whose plain attributes are walked last

    def visit(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            if not any(obj is m or _is_submodule(m, obj) for m in modules.values()):
                modules[path or "model"] = obj
            seen.update(id(sub) for sub in obj.modules())
            inside.append((obj, path or "model", depth))
            return
        if isinstance(obj, torch.optim.Optimizer):
            optimizers[path or "optimizer"] = obj
            return
        for child_path, child in children(obj, path):
            visit(child, child_path, depth + 1)

    visit(state, "", 0)
    while inside:
        module, path, depth = inside.pop(0)
        for name, value in _held_outside_children(module, path):
            visit(value, name, depth + 1)
    return modules, optimizers


def _held_outside_children(module: torch.nn.Module, path: str) -> Iterator[tuple[str, Any]]:
    """What a model's modules keep in plain attributes that can hold models or optimizers (a list, tuple or dict, an
    optimizer, a module kept out of registration), each by its path. Not a config or other object: those hold
    settings, and the walk stays cheap on a big model."""
    for name, sub in module.named_modules(prefix=path):
        for key, value in list(vars(sub).items()):
            if not key.startswith("_") and isinstance(value, (list, tuple, dict, torch.optim.Optimizer, torch.nn.Module)):
                yield f"{name}.{key}", value


def _is_submodule(parent: torch.nn.Module, child: torch.nn.Module) -> bool:
    return any(child is m for m in parent.modules())


def find_instances(state: Any, cls: type, limit: int = 50, namespaces: Namespaces = ()) -> list[str]:
    """Paths of objects in the state that are instances of `cls` (submodules of models included), and in the
    module globals of `namespaces` (`train.model`: a script-style trainer's `global model`)."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any, path: str, depth: int) -> None:
        if len(found) >= limit or id(obj) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            modules = list(obj.named_modules(prefix=path or "model"))
            for name, sub in modules:
                if isinstance(sub, cls) and len(found) < limit:
                    found.append(name)
                seen.add(id(sub))
            for name, sub in modules:
                # What a module keeps besides parameters and children: `self.config = GPTConfig(...)`.
                for key, value in list(vars(sub).items()):
                    if not key.startswith("_") and not isinstance(value, (torch.nn.Module, torch.Tensor)):
                        visit(value, f"{name}.{key}", depth + 1)
            return
        if isinstance(obj, cls):
            found.append(path or "state")
        for child_path, child in children(obj, path):
            visit(child, child_path, depth + 1)

    visit(state, "", 0)
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if not key.startswith("__") and not isinstance(value, NOT_STATE):
                visit(value, f"{module_name}.{key}", 1)
    return found



def training_object(value: Any) -> str | None:
    """What a module global holds that training made and a new object would not have (`the live model
    (RNNModel)`), or None: what `x` must not replace by running the statement that first bound it."""
    from torch.optim.lr_scheduler import LRScheduler

    if isinstance(value, torch.nn.Module) and next(itertools.chain(value.parameters(), value.buffers()), None) is None:
        return None  # `criterion = nn.NLLLoss()`: nothing training changed in it
    kinds = ((torch.nn.Module, "model"), (torch.optim.Optimizer, "optimizer"), (LRScheduler, "LR scheduler"))
    for cls, kind in kinds:
        if isinstance(value, cls):
            return f"the live {kind} ({type(value).__name__})"
    if isinstance(value, NOT_STATE) or isinstance(value, torch.Tensor):
        return None
    try:
        modules, optimizers = find_modules_and_optimizers(value)
    except RuntimeError:  # a dict the training thread resized meanwhile: say nothing rather than guess
        return None
    held = [*(f"model {p}" for p in modules), *(f"optimizer {p}" for p in optimizers)]
    if not held:
        return None
    return f"a {type(value).__name__} holding the live {', '.join(held[:3])}{' and more' if len(held) > 3 else ''}"


def find_with_globals(state: Any, namespaces: Namespaces) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
    """The state's modules and optimizers, and those only a module global holds, named `train.OPT_G`.

    Script-style trainers keep some in globals (`global OPT_G`, made by step() on first use): a snapshot
    that walked only the state would leave them out and say nothing.
    """
    modules, optimizers = find_modules_and_optimizers(state)
    known = {id(o) for o in optimizers.values()}
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if key.startswith("__"):
                continue
            if isinstance(value, torch.optim.Optimizer) and id(value) not in known:
                optimizers[f"{module_name}.{key}"] = value
                known.add(id(value))
            elif isinstance(value, torch.nn.Module) and not any(value is m or _is_submodule(m, value) for m in modules.values()):
                modules[f"{module_name}.{key}"] = value
    return modules, optimizers
