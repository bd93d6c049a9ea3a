"""What an LR scheduler was made with, as plain data: to tell an edited schedule from one that only moved on.

A rebuild compares the scheduler the new setup() made with what the last setup() made, both as made (at their start):
whatever differs is a setting the code changed (`gamma`, `total_steps`, a warm-up's length in a lambda, the rate
given to the optimizer), and nothing that training moved (the step, a plateau count, a project class's own counter)
can be taken for one. A scheduler's `state_dict()` alone does not do: it leaves out functions, a OneCycleLR's peak
and momentum range (kept in the optimizer's groups) and the rate setup() gave the optimizer.

A fingerprint is nested dicts, lists and plain values, so two compare with `==` and `differences` can name each
setting that changed.
"""

from __future__ import annotations

import functools
import hashlib
import re
import types
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

MAX_DEPTH = 6  # how deep into a scheduler's attributes (a config object, a wrapped scheduler) settings are read
MAX_VALUES = 20_000  # values read in all, per scheduler: beyond them, a type name stands for what is left
MAX_ITEMS = 256  # items of one list or dict: a longer one by its length and first items
SMALL_TENSOR = 4096  # elements: a tensor up to this size is compared by value, a larger one by a digest
LARGE_ARRAY = 1 << 24  # bytes: a tensor or array larger than this by its shape and dtype alone
# What a scheduler reads or writes in its optimizer's groups besides the keys the optimizer itself defines (those
# OneCycleLR and CyclicLR add: `initial_lr`, `max_lr`, `min_lr`, `max_momentum`, `base_momentum`, ...).
RATE_KEYS = ("lr",)
MOMENTUM_KEYS = ("momentum", "betas")
SCHEDULED_KEYS = RATE_KEYS + MOMENTUM_KEYS  # what a schedule may set in a group: what a rebuild carries of it
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a default repr's address differs between two equal objects


def fingerprint(scheduler: LRScheduler) -> dict[str, Any]:
    """The scheduler's settings as plain data: its class, its attributes (functions by their code), and the groups'
    rates and the keys it added to them. Read within a budget (a lambda closing over a dataset is not walked whole)."""
    return _scheduler(scheduler, 0, [MAX_VALUES])


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """`name old -> new` for each setting that differs between two fingerprints (a class change: `class A -> B`)."""
    if isinstance(old, dict) and "function" in old and old != new:
        return [f"{path} (the code of {old['function']})"]
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            name = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(f"{name} {_short(old.get(key))} -> {_short(new.get(key))}")
            else:
                out.extend(differences(old[key], new[key], name))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new)):
            out.extend(differences(a, b, f"{path}[{i}]"))
        return out
    return [] if old == new else [f"{path} {_short(old)} -> {_short(new)}"]


def cycles_momentum(scheduler: Any) -> bool:
    """OneCycleLR and CyclicLR move the momentum (or Adam's beta1) with the rate, also inside a SequentialLR."""
    inner = getattr(scheduler, "_schedulers", None) or ()
    return bool(getattr(scheduler, "cycle_momentum", False)) or any(cycles_momentum(s) for s in inner)


def _scheduler(scheduler: LRScheduler, depth: int, left: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"class": _qualname(type(scheduler))}
    for key, value in vars(scheduler).items():
        if key not in ("optimizer", "_last_lr"):  # the rates it set last are where it is, not what it was made with
            out[key.lstrip("_") or key] = _plain(value, depth + 1, left)
    optimizer = getattr(scheduler, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer):
        defined = set(optimizer.defaults) - set(RATE_KEYS)
        owned = RATE_KEYS + (MOMENTUM_KEYS if cycles_momentum(scheduler) else ())
        # The rate setup() gave is `initial_lr` once a scheduler has seen the group: its `lr` as made is the schedule's
        # start over a new optimizer, and wherever training had taken the rate over one setup() kept.
        out["param_groups"] = [
            {k: _plain(v, depth + 1, left) for k, v in group.items()
             if k != "params" and (k in owned or k not in defined) and not (k == "lr" and "initial_lr" in group)}
            for group in optimizer.param_groups
        ]
    return out


def _plain(value: Any, depth: int, left: list[int]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    left[0] -= 1
    if depth > MAX_DEPTH or left[0] < 0:
        return f"<{_qualname(type(value))}>"
    if isinstance(value, torch.Tensor):
        if value.numel() * value.element_size() > LARGE_ARRAY:
            return {"tensor": list(value.shape), "dtype": str(value.dtype)}
        data = value.detach().cpu()
        shown = data.tolist() if data.numel() <= SMALL_TENSOR else _digest(data.contiguous().numpy().tobytes())
        return {"tensor": list(data.shape), "dtype": str(data.dtype), "values": shown}
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k): _plain(v, depth + 1, left) for k, v in items[:MAX_ITEMS]}
        return out if len(items) <= MAX_ITEMS else {**out, "items": len(items)}
    if isinstance(value, (list, tuple)):
        out_list = [_plain(v, depth + 1, left) for v in value[:MAX_ITEMS]]
        return out_list if len(value) <= MAX_ITEMS else [*out_list, {"items": len(value)}]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(_plain(v, depth + 1, left)) for v in list(value)[:MAX_ITEMS]) + [f"items {len(value)}"]
    if isinstance(value, LRScheduler):
        return _scheduler(value, depth, left)
    if isinstance(value, (torch.optim.Optimizer, torch.nn.Module)):
        return f"<{_qualname(type(value))}>"  # what it holds is the state's, not the schedule's
    if isinstance(value, functools.partial):
        return {"partial": _plain(value.func, depth + 1, left), "args": _plain(value.args, depth + 1, left),
                "keywords": _plain(value.keywords, depth + 1, left)}
    if isinstance(value, (types.FunctionType, types.MethodType)):
        function = value.__func__ if isinstance(value, types.MethodType) else value
        return {"function": function.__qualname__, "code": _code(function.__code__, depth + 1, left),
                "defaults": _plain(function.__defaults__, depth + 1, left),
                "closure": [_plain(cell.cell_contents, depth + 1, left) for cell in function.__closure__ or ()
                            if _filled(cell)]}
    if type(value).__module__.split(".")[0] == "numpy" and hasattr(value, "tobytes"):
        nbytes = getattr(value, "nbytes", 0)
        values = _digest(str(getattr(value, "dtype", "")).encode() + value.tobytes()) if nbytes <= LARGE_ARRAY else None
        return {"array": _qualname(type(value)), "shape": list(getattr(value, "shape", ())), "values": values}
    attributes = _attributes(value)
    if attributes:
        return {"object": _qualname(type(value)),
                **{k: _plain(v, depth + 1, left) for k, v in list(attributes.items())[:MAX_ITEMS]}}
    return {"value": _qualname(type(value)), "repr": ADDRESS.sub("", repr(value))[:200]}


def _attributes(value: Any) -> dict[str, Any]:
    """An object's attributes: its `__dict__`, or the `__slots__` its classes fill."""
    attributes = getattr(value, "__dict__", None)
    found = dict(attributes) if isinstance(attributes, dict) else {}
    for kind in type(value).__mro__:
        slots = kind.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                found.setdefault(name, getattr(value, name))
    return found


def _code(code: types.CodeType, depth: int, left: list[int]) -> Any:
    """A function's code, so an edited lambda or warm-up function reads as changed (its constants: `10` -> `100`)."""
    consts = [_code(c, depth + 1, left) if isinstance(c, types.CodeType) else _plain(c, depth + 1, left)
              for c in code.co_consts]
    return {"bytecode": _digest(code.co_code), "consts": consts, "names": list(code.co_names)}


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _qualname(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _short(value: Any) -> str:
    if isinstance(value, dict) and "function" in value:
        return f"<function {value['function']}>"
    if isinstance(value, dict) and "class" in value:
        return value["class"].rsplit(".", 1)[-1]
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
