"""Say when a save cannot reach DataLoader worker processes.

A DataLoader with `num_workers > 0` forks its workers when an epoch's iterator
starts, and each worker runs a copy of the dataset's code as it was at that
moment. A reload patches the main process only: a changed `Dataset.__getitem__`
(or a function it calls, or the loader's `collate_fn`) runs old code in the
workers until they start again. That is never silent: the reload event names
the loader, the code, and when the new code will take over.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

_MAX_DEPTH = 4
_MAX_ITEMS = 256


def find_loaders(roots: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, DataLoader]]:
    """(path, loader) for each DataLoader with worker processes reachable from the roots, each once.

    Looks through dicts, lists, attributes, the iterator of a loader (it knows its loader only by its
    parts, so the loader is found next to it), and the locals of running generators (`for b in loader`).
    """
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, name, 0) for name, root in roots]
    while stack:
        obj, path, depth = stack.pop()
        if id(obj) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, DataLoader):
            if obj.num_workers > 0:
                yield path, obj
            continue
        if isinstance(obj, types.GeneratorType):
            frame = obj.gi_frame
            if frame is not None:
                stack.extend((value, f"{path}.<locals>.{key}", depth + 1) for key, value in frame.f_locals.items())
        elif isinstance(obj, dict):
            stack.extend((v, f"{path}[{k!r}]", depth + 1) for k, v in itertools.islice(obj.items(), _MAX_ITEMS)
                         if not (isinstance(k, str) and k.startswith("__")))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(itertools.islice(obj, _MAX_ITEMS)))
        elif isinstance(obj, (type, types.ModuleType, types.FunctionType, str, bytes, int, float)):
            continue
        elif hasattr(obj, "__dict__") and not _is_tensor_like(obj):
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in vars(obj).items())


def _is_tensor_like(obj: Any) -> bool:
    import torch

    return isinstance(obj, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer))


def datasets_in(dataset: Any, depth: int = 0) -> Iterator[Any]:
    """The dataset and those it wraps: `random_split`'s Subset (`.dataset`), ConcatDataset's and ChainDataset's
    `.datasets`, and a user's wrapper holding either; the workers run the wrapped datasets' code too."""
    yield dataset
    if depth >= _MAX_DEPTH:
        return
    inner = getattr(dataset, "dataset", None)
    if inner is not None and inner is not dataset:
        yield from datasets_in(inner, depth + 1)
    for each in itertools.islice(getattr(dataset, "datasets", None) or (), _MAX_ITEMS):
        yield from datasets_in(each, depth + 1)


def code_run_by_workers(loader: DataLoader, module: types.ModuleType) -> set[str]:
    """Qualified names, in `module`, of the code a loader's workers run: the dataset's classes (with their
    methods), the module functions those methods call by name, and the loader's collate and init functions."""
    names: set[str] = set()
    called: set[str] = set()
    for cls in (c for dataset in datasets_in(loader.dataset) for c in type(dataset).__mro__):
        if cls.__module__ != module.__name__:
            continue
        names.add(cls.__qualname__)
        for member in vars(cls).values():
            code = getattr(member, "__code__", None)
            if code is not None:
                called.update(code.co_names)
    for fn in (loader.collate_fn, loader.worker_init_fn):
        if getattr(fn, "__module__", None) == module.__name__:
            names.add(fn.__qualname__)
            called.update(getattr(getattr(fn, "__code__", None), "co_names", ()))
    names.update(name for name in called if isinstance(module.__dict__.get(name), types.FunctionType))
    return names


def worker_notes(
    roots: Iterable[tuple[str, Any]], changed: Iterable[str], module: types.ModuleType, change: str = "this save"
) -> list[str]:
    """One note per loader whose workers run changed code (`changed`: the reload's qualified names)."""
    changed = list(changed)
    notes = []
    for path, loader in find_loaders(roots):
        run = code_run_by_workers(loader, module)
        stale = sorted({name for name in changed if name in run or name.split(".")[0] in run})
        if not stale:
            continue
        shown = ", ".join(stale[:5])
        if loader.persistent_workers:
            if getattr(loader, "_iterator", None) is None:
                continue  # its workers have not started yet: they will start with the new code
            notes.append(f"{path} runs {shown} in {loader.num_workers} worker processes forked before {change}: they are "
                         "persistent, so they keep it for the rest of the session: press R (command `rebuild`) to start "
                         "new workers with the new code")
        else:
            # Whether an epoch's iterator is alive cannot be seen from the loader (a `for` loop holds it), so this says
            # what holds either way rather than claim workers that may not be running.
            notes.append(f"{path} runs {shown} in worker processes: those of an epoch running now were forked before "
                         f"{change} and keep the old code until it ends; the next epoch's workers start with the new code")
    return notes
