"""Say when a save cannot reach DataLoader worker processes.

A DataLoader with `num_workers > 0` forks its workers when an epoch's iterator
starts, and each worker runs a copy of the dataset's code as it was at that
moment. A reload patches the main process only: a changed `Dataset.__getitem__`
(or a function it calls, or the loader's `collate_fn`) runs old code in the
workers until they start again. That is never silent: the reload event names
the loader, the code, and when the new code will take over.

"When" needs the live iterator, not only the loader. makemore's `InfiniteDataLoader`
(ported from karpathy/makemore) makes one iterator at import over a sampler of 1e10
samples, so "until the epoch ends" means never; and it lives in a module global made
at import, which setup() does not make again, so "press R" started no new workers.
The live multi-process iterators are found too (a plain object's attributes, a
generator's locals), and each note says how many batches its epoch has left and how
new workers start: R makes the loader again, through setup() or by running again the
statement that made it at import (import_builders.py), which the note names.
"""

from __future__ import annotations

import gc
import itertools
import types
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


_MAX_DEPTH = 4
_MAX_ITEMS = 256
# Beyond this many batches left, an epoch is said to outlast the run for any purpose a user has.
_ENDLESS_BATCHES = 10_000_000


@dataclass(frozen=True)
class LoaderRoot:
    """Where loaders are looked for: the state, a module global. `remade_by_rebuild`: R's setup() makes what this
    root holds again (setup()'s state, a global that setup() binds); not so for a global the file binds at import.
    For such a global: `global_name` (module, name), and `builder`, the label of the statement that made it, which R
    can run again (None: no statement at the top of the file makes it). `builder_of` gives it when asked: finding it
    parses the file, on the training thread, which only a root that holds workers needs."""

    name: str
    value: Any
    remade_by_rebuild: bool
    global_name: tuple[str, str] | None = None
    builder_of: Callable[[], str | None] | None = None

    @property
    def builder(self) -> str | None:
        return self.builder_of() if self.builder_of is not None else None


@dataclass
class _Found:
    path: str
    obj: Any
    remade_by_rebuild: bool = True
    held_at_import: LoaderRoot | None = None  # the first root made at import that reaches it


@dataclass
class WorkerNotes:
    """The notes, and the globals made at import whose statements R should run again to start new workers."""

    notes: list[str]
    rebuild: list[tuple[str, str]]
    running: list[Any] = field(default_factory=list)  # every multi-process iterator with live workers found


def _walk(root: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, object) for each DataLoader with workers and each multi-process iterator under `root`, each once.

    Goes through dicts, lists, attributes (`batch_loader.data_iter`), the locals of running generators and the
    iterators they are reading (`for b in loader`, `yield from loader`); a persistent loader's iterator is its
    `_iterator`."""
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, path, 0)]
    while stack:
        obj, at, depth = stack.pop()
        if id(obj) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, _MultiProcessingDataLoaderIter):
            yield at, obj
            continue
        if isinstance(obj, DataLoader):
            if obj.num_workers > 0:
                yield at, obj
                iterator = getattr(obj, "_iterator", None)
                if isinstance(iterator, _MultiProcessingDataLoaderIter) and id(iterator) not in seen:
                    seen.add(id(iterator))
                    yield f"{at}._iterator", iterator
            continue
        if isinstance(obj, types.GeneratorType):
            frame = obj.gi_frame
            if frame is not None:
                stack.extend((value, f"{at}'s {key}", depth + 1) for key, value in frame.f_locals.items())
                # The iterator of a `for batch in loader` is on the frame's stack, and that of `yield from loader` is
                # what it delegates to: neither is a local. Without them the note could not say how much of the
                # running epoch keeps the old code (pytorch-cifar's port: `yield from loader`).
                held = [value for value in gc.get_referents(obj) if isinstance(value, _MultiProcessingDataLoaderIter)]
                if obj.gi_yieldfrom is not None:
                    held.append(obj.gi_yieldfrom)
                stack.extend((value, f"{at}'s running iterator", depth + 1) for value in held)
        elif isinstance(obj, dict):
            items = list(itertools.islice(obj.items(), _MAX_ITEMS))  # taken at once: another thread may change it
            stack.extend((v, f"{at}[{k!r}]", depth + 1) for k, v in items if not (isinstance(k, str) and k.startswith("__")))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, f"{at}[{i}]", depth + 1) for i, v in enumerate(itertools.islice(obj, _MAX_ITEMS)))
        elif isinstance(obj, (type, types.ModuleType, types.FunctionType, str, bytes, int, float)):
            continue
        elif hasattr(obj, "__dict__") and not _is_tensor_like(obj):
            # Private attributes too: a wrapper's `self._loader` holds workers as much as a public one.
            stack.extend((v, f"{at}.{k}", depth + 1) for k, v in list(vars(obj).items()))


def running_iterators(root: Any, name: str) -> list[_MultiProcessingDataLoaderIter]:
    """The multi-process iterators under `root` whose workers are running, private attributes included (a plain
    DataLoader's persistent `_iterator`, a wrapper's `self._it`)."""
    return [obj for _, obj in _walk(root, name)
            if isinstance(obj, _MultiProcessingDataLoaderIter) and not obj._shutdown and obj._workers]


def _find(roots: Iterable[LoaderRoot]) -> list[_Found]:
    """Every loader with workers and multi-process iterator, by the first path that reaches it, and whether R makes
    it again: only if no root made at import reaches it."""
    found: dict[int, _Found] = {}
    for root in roots:
        for path, obj in _walk(root.value, root.name):
            entry = found.setdefault(id(obj), _Found(path, obj))
            if not root.remade_by_rebuild:
                entry.remade_by_rebuild = False
                entry.held_at_import = entry.held_at_import or root
    return list(found.values())


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


def code_run_by_workers(loader: DataLoader | _MultiProcessingDataLoaderIter, module: types.ModuleType) -> set[str]:
    """Qualified names, in `module`, of the code a loader's (or an iterator's) workers run: the dataset's classes
    (with their methods), the module functions those methods call by name, and the collate and init functions."""
    if isinstance(loader, _MultiProcessingDataLoaderIter):
        dataset, functions = loader._dataset, (loader._collate_fn, loader._worker_init_fn)
    else:
        dataset, functions = loader.dataset, (loader.collate_fn, loader.worker_init_fn)
    names: set[str] = set()
    called: set[str] = set()
    for cls in (c for each in datasets_in(dataset) for c in type(each).__mro__):
        if cls.__module__ != module.__name__:
            continue
        names.add(cls.__qualname__)
        for member in vars(cls).values():
            code = getattr(member, "__code__", None)
            if code is not None:
                called.update(code.co_names)
    for fn in functions:
        if getattr(fn, "__module__", None) == module.__name__:
            names.add(fn.__qualname__)
            called.update(getattr(getattr(fn, "__code__", None), "co_names", ()))
    names.update(name for name in called if isinstance(module.__dict__.get(name), types.FunctionType))
    return names


def _iterates(iterator: _MultiProcessingDataLoaderIter, loader: DataLoader) -> bool:
    """Whether `iterator` is an epoch of `loader` (an iterator knows its loader only by its parts)."""
    return loader._iterator is iterator or (
        iterator._dataset is loader.dataset and iterator._index_sampler is loader._index_sampler)


def _epoch_left(iterator: _MultiProcessingDataLoaderIter, live: str) -> str:
    try:
        total = len(iterator)
    except Exception:  # noqa: BLE001 - no __len__ (an IterableDataset), or a sampler's that raises: the end is unknown
        return "until its epoch ends"
    left = max(total - iterator._num_yielded, 0)
    if left > _ENDLESS_BATCHES:
        return f"until its epoch ends, {left:,} batches from now: in effect, for the rest of the session"
    return (f"until its epoch ends, {left:,} of its {total:,} batches from now (the next epoch's workers start "
            f"with {live})")


def _new_workers(entry: _Found, live: str) -> str:
    """How new workers start: R, when setup() makes the loader or R runs again the statement that made it at import;
    otherwise only a new iterator."""
    if entry.remade_by_rebuild:
        return f"press R (command `rebuild`) to start new workers with {live}"
    root = entry.held_at_import
    if root is not None and root.builder is not None:
        return (f"{root.name} is made at import, not by setup(): press R (command `rebuild`), which runs "
                f"{root.builder} again, to start new workers with {live}")
    return (f"R (command `rebuild`) does not start new ones: {root.name if root else 'it'} is made outside setup(), "
            "and no statement at the top of the file makes it; a new iterator over the loader (one your code makes, "
            f"or a fresh start) starts workers with {live}")


def worker_notes(
    roots: Iterable[LoaderRoot], changed: Iterable[str], module: types.ModuleType, change: str = "this save",
    running_before: Container[Any] = (),
) -> WorkerNotes:
    """One note per loader (or iterator) whose workers run changed code (`changed`: the reload's qualified names).
    `running_before`: for a rollback, the iterators already running when the undone save was applied; their workers
    were forked with the code before it, which is live again, so nothing is said of them."""
    changed = list(changed)
    found = _find(roots)
    iterators = [f for f in found if isinstance(f.obj, _MultiProcessingDataLoaderIter)]
    loaders = [f for f in found if isinstance(f.obj, DataLoader)]
    notes = []
    rebuild: list[tuple[str, str]] = []
    # After a rollback the workers' copy is the newer code: "old" and "new" would read the wrong way round.
    kept, live = ("the old code", "the new code") if change == "this save" else ("the rolled-back code", "the live code")

    def stale_in(obj: Any) -> str:
        run = code_run_by_workers(obj, module)
        stale = sorted({name for name in changed if name in run or name.split(".")[0] in run})
        return ", ".join(stale[:5])

    told: set[int] = set()
    running = []
    for entry in iterators:
        iterator = entry.obj
        if iterator._shutdown or not iterator._workers:
            continue
        running.append(iterator)
        loader = next((each for each in loaders if _iterates(iterator, each.obj)), None)
        if iterator in running_before:
            if loader is not None:
                told.add(id(loader.obj))  # its running epoch's workers are the ones just left out
            continue
        if not (shown := stale_in(iterator)):
            continue
        if loader is not None:
            told.add(id(loader.obj))
            entry.remade_by_rebuild = entry.remade_by_rebuild and loader.remade_by_rebuild
            entry.held_at_import = entry.held_at_import or loader.held_at_import
        name = loader.path if loader is not None else f"the iterator {entry.path}"
        root = entry.held_at_import
        if not entry.remade_by_rebuild and root is not None and root.builder is not None and root.global_name:
            rebuild.append(root.global_name)
        count = len(iterator._workers)
        workers = f"{count} worker process{'' if count == 1 else 'es'} forked before {change}"
        they, are, keep = ("it", "is", "keeps") if count == 1 else ("they", "are", "keep")
        if iterator._persistent_workers:
            notes.append(f"{name} runs {shown} in {workers}: {they} {are} persistent, so {they} {keep} it for the rest "
                         f"of the session: {_new_workers(entry, live)}")
        else:
            notes.append(f"{name} runs {shown} in {workers}, when its epoch began: {they} {keep} {kept} "
                         f"{_epoch_left(iterator, live)}; {_new_workers(entry, live)}")
    for entry in loaders:
        loader = entry.obj
        if id(loader) in told or loader.persistent_workers or not (shown := stale_in(loader)):
            continue  # a persistent loader's workers start with its first iterator, with the code of then
        # The iterator of an epoch running now may be out of sight (a `for` loop holds it), so this says what holds
        # either way rather than claim workers that may not be running.
        notes.append(f"{entry.path} runs {shown} in worker processes: those of an epoch running now were forked "
                     f"before {change} and keep {kept} until it ends; the next epoch's workers start with {live}")
    return WorkerNotes(notes, rebuild, running)
