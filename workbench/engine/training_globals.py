"""Counters a script-style trainer keeps in module globals (nanoGPT's `iter_num`, `best_val_loss`): kept in
snapshots and put back on resume.

A snapshot holds the models, the optimizers, the step and the RNG. A trainer that counts its own iterations
in a global (`global iter_num; iter_num += 1` in step()) resumed with setup()'s value, 0: its learning-rate
schedule warmed up again from the start while the resume said it had loaded everything. So the plain values
(bool, int, float, short str) that have changed since setup() left them, other than by a saved statement of the
file (an edited constant is the file's, read again at the next start), go into the snapshot by
`module.name`, and a resume puts them back once setup() has run.

The plain values of setup()'s own state dict are training state too: score_sde_pytorch's trainer returns
`state = dict(optimizer=..., model=..., ema=..., step=0)` and step() counts `state['step'] += 1`, which its
learning-rate warm-up reads; a resume began it at 0 again. They take part as one more namespace, `STATE`, whose
name no module can have, shown as `state['step']`; and a rebuild's setup(), which makes them again as they were,
is given the values training reached (`carry_state`).

So are the plain attributes of the project's own objects in that state: minGPT's `Trainer` counts
`self.iter_num`, which its callback reads (`iter_num % 500 == 0` samples text, drawing from the random generator),
and a resume or rebuild began it at 0 with no note, so the run went apart from the one that never stopped. Each
such object is one more namespace (its `vars()`), named by the path the user's code reaches it by
(`state['trainer']`), so `state['trainer'].iter_num` is kept, put back and carried as `state['step']` is. Torch's
own objects (modules, optimizers, loaders, datasets) are not among them: their state has its own keeping; nor is an
object with `state_dict()` and `load_state_dict()` (an EMA), which keeps itself; nor an object's tensors, which the
state's tensors' keeping (training_tensors.py) has, or not, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Namespaces = list[tuple[str, dict[str, Any]]]

MAX_STR = 256  # a longer string is more likely a log or a path than a counter or a phase name


STATE = "setup()"  # the namespace of setup()'s state dict's plain values; a module's name never has parentheses


def state_namespace(state: Any, project_modules: frozenset[str] = frozenset()) -> Namespaces:
    """setup()'s state as a namespace when it is a dict (its keys that are names), and each object of a class of
    `project_modules` in it (`object_namespaces`)."""
    return ([(STATE, state)] if isinstance(state, dict) else []) + object_namespaces(state, project_modules)


def object_namespaces(state: Any, project_modules: frozenset[str]) -> Namespaces:
    """The objects of the project's own classes at the top of the dict (or list) setup() returned (`state['trainer']`),
    each as its attributes, by the path the user's code reaches it by.
    Torch's modules, optimizers, schedulers and loaders are left to their own keeping (snapshots, loader places)."""
    if not project_modules:
        return []
    from workbench.engine.state_walk import top_values  # here: state_walk imports torch, this module need not

    found: Namespaces = []
    seen: set[int] = set()
    for label, value in top_values(state):
        # Only a dict's or a list's items: `state['trainer']` can be no module's name, where `state.trainer` could
        # (a project's state/trainer.py), and a kept value is found again by its namespace's name.
        if "[" not in label or id(value) in seen or not _project_object(value, project_modules):
            continue
        seen.add(id(value))
        found.append((label, vars(value)))
    return found


def _project_object(value: Any, project_modules: frozenset[str]) -> bool:
    """An object of the project's own class with attributes, and no keeping of its own: torch's modules, optimizers,
    schedulers and loaders have theirs, as has an object with `state_dict()` and `load_state_dict()` (an EMA, a loader
    of the project's: loader_places.py gives it what its `state_dict()` held)."""
    import torch

    kind = type(value)
    own_keeping = callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))
    return (kind.__module__ in project_modules and hasattr(value, "__dict__") and not isinstance(value, type)
            and not own_keeping
            and not isinstance(value, (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
                                       torch.utils.data.DataLoader, torch.utils.data.Dataset)))


def shown(qualified: str) -> str:
    """`train.iter_num` and `state['trainer'].iter_num` as they are; `setup().step` as `state['step']`."""
    module, name = split_qualified(qualified)
    return f"state[{name!r}]" if module == STATE else qualified


def _named(name: Any) -> bool:
    """A name a value can be kept by: a module global's (not a dunder, which are the interpreter's), or any str key
    of setup()'s dict (`state['global-step']`: `STATE` has no dot, so the key after it may)."""
    return isinstance(name, str) and not name.startswith("__")


def split_qualified(qualified: str) -> tuple[str, str]:
    """`train.iter_num` -> (`train`, `iter_num`); `setup().val/loss.best` -> (`setup()`, `val/loss.best`)."""
    if qualified.startswith(STATE + "."):
        return STATE, qualified[len(STATE) + 1:]
    module, _, name = qualified.rpartition(".")
    return module, name


def _plain_values(namespace: dict[Any, Any]) -> dict[str, Any]:
    """The plain values by name, and those still None (a `best_val_loss = None` before the first evaluation): one
    training then sets counts as changed, and a rebuild whose setup() starts it as None again is given it."""
    return {k: v for k, v in namespace.items() if _named(k) and (_plain(v) or v is None)}


def _plain(value: Any) -> bool:
    return type(value) in (bool, int, float) or (type(value) is str and len(value) <= MAX_STR)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    return a == b or (type(a) is float and math.isnan(a) and math.isnan(b))


class TrainingGlobals:
    """The plain module globals as setup() left them; what differs at a snapshot is training state."""

    def __init__(self) -> None:
        self._after_setup: dict[str, dict[str, Any]] = {}

    def mark(self, namespaces: Namespaces, made_by_setup: dict[str, dict[str, Any]] | None = None) -> None:
        """After setup() (the first, a rebuild's): the values training starts from. `made_by_setup`: what a
        rebuild's setup() made of the state's values (by namespace) before `carry_state` gave it those training had
        reached, the state's baseline still (else a snapshot right after the rebuild left out the carried count, and
        a second rebuild took it for a start value setup() had changed and dropped it)."""
        self._after_setup = {module: _plain_values(namespace) for module, namespace in namespaces}
        for label, values in (made_by_setup or {}).items():
            if label in self._after_setup:
                self._after_setup[label] = values

    def state_values(self, state: Any, project_modules: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
        """setup()'s plain values as it made them (before any carrying), by namespace: a rebuild's baseline for
        `mark`."""
        return {label: _plain_values(namespace) for label, namespace in state_namespace(state, project_modules)}

    def changed(self, namespaces: Namespaces, file_bound: dict[str, set[str]]) -> dict[str, Any]:
        """{"module.name": value} for the plain globals changed since `mark`, but those `file_bound` names (bound
        by saved statements since) and dunder names (`__doc__` and the like are the interpreter's)."""
        found: dict[str, Any] = {}
        for module, namespace in namespaces:
            before, bound = self._after_setup.get(module, {}), file_bound.get(module, set())
            for name, value in list(namespace.items()):
                if not _named(name) or name in bound or not _plain(value):
                    continue
                if name not in before or not _same(before[name], value):
                    found[f"{module}.{name}"] = value
        return found


def put_back(saved: dict[str, Any], namespaces: Namespaces) -> tuple[list[str], list[str]]:
    """Resume: set each saved global whose module is loaded and whose current value is plain, None (a
    script's `best_val_loss = None` before its first evaluation) or unbound.
    Returns (`module.name = value` for each one set, a reason for each one left)."""
    def give(namespace: dict[str, Any], name: str, value: Any) -> str | None:
        if name in namespace and not (_plain(namespace[name]) or namespace[name] is None):  # None: not set yet
            return f"now a {type(namespace[name]).__name__}, not a {type(value).__name__}"
        namespace[name] = value
        return None

    given, left = put_back_each(saved, namespaces, give)
    return [f"{shown(qualified)} = {saved[qualified]!r}" for qualified in given], left


def put_back_each(saved: dict[str, Any], namespaces: Namespaces,
                  give: Callable[[dict[str, Any], str, Any], str | None]) -> tuple[list[str], list[str]]:
    """Resume: `give(namespace, name, value)` each saved value whose namespace is here (it returns None once it has
    set it, else why not). Returns (the qualified names given, `shown name (why)` for each one left)."""
    by_module = dict(namespaces)
    given: list[str] = []
    left: list[str] = []
    for qualified, value in saved.items():
        module, name = split_qualified(qualified)
        namespace = by_module.get(module)
        if namespace is None:
            why: str | None = "setup() returned no dict" if module == STATE else f"module {module} is not loaded"
        else:
            why = give(namespace, name, value)
        if why is None:
            given.append(qualified)
        else:
            left.append(f"{shown(qualified)} ({why})")
    return given, left


def carry_state(before_rebuild: Any, rebuilt: Any, marked: TrainingGlobals,
                project_modules: frozenset[str] = frozenset()) -> list[str]:
    """A rebuild: each plain value of the old state (and of its project objects) that training changed, into the new
    state where its setup() made the value the old setup() made (an edited start value is the new code's). The
    rebuild's notes."""
    old_spaces = dict(state_namespace(before_rebuild, project_modules))
    carried = []
    for label, new_space in state_namespace(rebuilt, project_modules):
        old_space = old_spaces.get(label)
        if old_space is None:
            continue
        for name, first in marked._after_setup.get(label, {}).items():
            old, new = old_space.get(name, first), new_space.get(name)
            if name in new_space and _same(new, first) and _plain(old) and not _same(old, first):
                new_space[name] = old
                carried.append(f"{shown(f'{label}.{name}')} = {old!r}")
    return [f"carried over (plain values of the state that training changed, which setup() made again as they "
            f"began): {', '.join(carried)}"] if carried else []
