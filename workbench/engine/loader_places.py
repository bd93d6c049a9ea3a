"""Where each stateful data loader was: kept in snapshots, put back at resume.

A snapshot keeps no iterator's place (fresh_iterators.py says so at resume), but a loader that can say where it is
can be given it back: torchdata's StatefulDataLoader, or any DataLoader with `state_dict()` and `load_state_dict()`.
Its state holds how many batches it has handed out this epoch and its sampler's RNG (with workers, each worker's),
and a fresh loader given it hands out next the batch the uninterrupted run would have. So a snapshot keeps each
such loader's state, found where the models are (setup()'s state, module globals) and in the arguments of the
generators there (`batches(loader)`, or a loader a generator defined in setup() closes over); under torchrun every
rank's own, since each rank's loader reads its own shard of the data. A resume gives each fresh loader its state
before the first step asks it for a batch; one that cannot take it (another number of ranks, a state the snapshot
lacks, an iterator setup() already made from it) starts over, and the `resume` event says which and why.

A trainer's own loader can take part the same way (torch.distributed.checkpoint's `Stateful` protocol): an object of
a class of the project, not a model or optimizer and holding none (a `Trainer` that checkpoints them all is walked
into, for the loaders it holds), with `state_dict()` and `load_state_dict()`. llm.c's
`DistributedDataLoader` (ported) walks its shards in order from a `current_position`; without this a resume read
the first batches again. Such a state must be small, plain data: a place, not a model (more than 1 MiB of tensors
is refused and said).
"""

from __future__ import annotations

import io
import itertools
import types
from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any

import torch
from torch.utils.data import DataLoader

from workbench.engine.state_walk import Namespaces, find_reachable, generator_inputs, reachable

LOADER = "loader"  # the `where` of the warning after the first resumed step (in events.WARNINGS)
SHARDED_KEY = "loader_places/rank{rank}"  # each rank's record in a sharded (DCP) snapshot: a key of its own


MAX_PLACE_TENSOR_BYTES = 1 << 20  # a project object's state above this is a model's, not a place in the data


def is_stateful_loader(obj: Any, project_modules: frozenset[str] = frozenset()) -> bool:
    """A DataLoader that can say where it is, or an object of a project class (in `project_modules`) that can."""
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        return False
    if isinstance(obj, DataLoader):
        return True
    from torch.optim.lr_scheduler import LRScheduler

    training = (torch.nn.Module, torch.optim.Optimizer, LRScheduler, DataLoader)
    return (type(obj).__module__ in project_modules and not isinstance(obj, (type, types.ModuleType, *training))
            and not _holds_any(obj, training))


def _holds_any(obj: Any, kinds: tuple[type, ...]) -> bool:
    """Whether an attribute of `obj` (or an item of a dict or list there) is a model, optimizer, scheduler or loader:
    then `obj` is a trainer that checkpoints them all, not a place in the data, and the walk goes on into it to find
    the loaders it holds."""
    try:
        values = list(vars(obj).values())
    except TypeError:  # no __dict__ (slots)
        return False
    for value in values:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        if isinstance(value, kinds) or any(isinstance(item, kinds) for item in list(itertools.islice(inner, 256))):
            return True
    return False


def find_loaders(state: Any, namespaces: Namespaces = ()) -> dict[str, Any]:
    """Every stateful loader in the state and the project's module globals, each once, by a path that names it the
    same way in the run that snapshots and the run that resumes (`batches(loader)`: the generator's argument)."""
    namespaces = list(namespaces)
    project_modules = frozenset(name for name, _ in namespaces)
    return find_reachable(state, namespaces, lambda obj: is_stateful_loader(obj, project_modules), "loader",
                          stop_at=(DataLoader,), into_generators=True)


def loaders_read_by(generator: GeneratorType) -> list[DataLoader]:
    """The stateful loaders a generator was given or closes over, or that what it was given holds (imagenet's
    `epochs(state)` reads `state["train_loader"]`)."""
    seen: set[int] = {id(generator)}
    return [loader for path, value in generator_inputs(generator, "")
            for _, loader in reachable(value, path, matches=is_stateful_loader, seen=seen, depth=1,
                                       stop_at=(DataLoader,), into_generators=True)]


def _has_begun(loader: Any) -> bool:
    """Whether iter() was ever called on it. A StatefulDataLoader's `state_dict()` makes an iterator when there is
    none (with workers, it starts them): a loader never iterated (a test loader) is not asked. A project's own
    loader always says where it is."""
    return not isinstance(loader, DataLoader) or getattr(loader, "_iterator", True) is not None


def _too_big(state: Any) -> str | None:
    """Why a project object's state is no place in the data (it holds a model's worth of tensors), or None."""
    held = 0
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            held += value.numel() * value.element_size()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    if held > MAX_PLACE_TENSOR_BYTES:
        return f"its state_dict() holds {held / 2**20:.1f} MiB of tensors: a model's state, not a place in the data"
    return None


def record(loaders: dict[str, DataLoader]) -> dict[str, Any]:
    """This rank's places: `states` by path (None: not begun, nothing to put back), and `errors` for a state that
    could not be taken or is not plain data (a snapshot is read with weights_only=True: anything else would cost the
    whole resume)."""
    states: dict[str, Any] = {}
    errors: dict[str, str] = {}
    epochs: dict[str, int] = {}
    for path, loader in loaders.items():
        if not _has_begun(loader):
            states[path] = None
            continue
        epoch = sampler_epoch(loader)
        if epoch is not None:
            epochs[path] = epoch
        try:
            state = loader.state_dict()
            if not isinstance(loader, DataLoader) and (why := _too_big(state)) is not None:
                errors[path] = why
                continue
            unpack(pack(state))
        except Exception as exc:  # noqa: BLE001 - a loader or dataset whose state is not plain data
            errors[path] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        states[path] = state
    return {"states": states, "errors": errors, "epochs": epochs}


def sampler_epoch(loader: DataLoader) -> int | None:
    """The epoch a DistributedSampler (or any sampler with an int `epoch`) was last set to: it decides the order of
    the data, and the loader's state says only where in that order it is."""
    epoch = getattr(getattr(loader, "sampler", None), "epoch", None)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def pack(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def unpack(raw: bytes) -> Any:
    return torch.load(io.BytesIO(raw), weights_only=True)


def places(records: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """What a one-file snapshot keeps: each rank's record, and for how many ranks they were taken."""
    return {"world_size": world_size, "ranks": records}


@dataclass
class EpochCheck:
    """After the first resumed step: a loader given back its place whose sampler's epoch is not the snapshot's goes
    on from the right place in another epoch's order (the generator's own epoch count started over). Said then."""

    expected: list[tuple[str, DataLoader, int]]  # (path, loader, the sampler's epoch at the snapshot)
    step: int  # the snapshot's step

    def after_step(self) -> str | None:
        wrong = [(path, now, then) for path, loader, then in self.expected
                 if (now := sampler_epoch(loader)) is not None and now != then]
        if not wrong:
            return None
        shown = "; ".join(f"{path}'s sampler is at epoch {now}, where step {self.step} was in epoch {then}"
                          for path, now, then in wrong)
        return (f"after the resume, {shown}: the loader went on from its place, but in that epoch's order, so it reads "
                "other batches than the run would have. The code that calls set_epoch() started its count over: keep "
                "the epoch in a module global it reads (`global epoch` ... `epoch += 1`), which snapshots keep")


@dataclass
class PutBack:
    """What a resume did with the loaders: those given their place (by id, their paths), the notes, and the check
    of their samplers' epochs after the first step."""

    placed: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    epoch_check: EpochCheck | None = None


def put_back(loaders: dict[str, DataLoader], saved: dict[str, Any] | None, rank: int, world_size: int,
             step: int) -> PutBack:
    """Give each fresh loader its place from the snapshot: which ones, and the resume's notes (those that go on,
    and those that start over and why)."""
    if not loaders and not saved:
        return PutBack()
    notes: list[str] = []
    if saved is None:
        return PutBack(notes=[f"{_names(loaders)}: the snapshot keeps no loader's place (it was written before "
                              "vram-bench kept them), so they start from their beginning"])
    if saved.get("error"):
        return PutBack(notes=[f"{_names(loaders)}: the snapshot's loader places could not be read ({saved['error']}), "
                              "so they start from their beginning"] if loaders else [])
    ranks = saved.get("ranks") or {}
    mine = ranks.get(rank) if saved.get("world_size") == world_size else None
    if saved.get("world_size") != world_size:
        if loaders:
            notes.append(f"{_names(loaders)}: the snapshot's loader places are for {saved.get('world_size')} ranks' "
                         f"shares of the data, and this run has {world_size}, so they start from their beginning")
        return PutBack(notes=notes)
    if mine is None:
        mine = {"states": {}, "errors": {}}
    states: dict[str, Any] = mine.get("states") or {}
    errors: dict[str, str] = mine.get("errors") or {}
    epochs: dict[str, int] = mine.get("epochs") or {}
    placed: dict[int, str] = {}
    expected: list[tuple[str, DataLoader, int]] = []
    for path, loader in loaders.items():
        kind = type(loader).__name__
        if path in errors:
            notes.append(f"{path} ({kind}) starts from its beginning: its place could not be kept at step {step} "
                         f"({errors[path]})")
        elif path not in states:
            notes.append(f"{path} ({kind}) starts from its beginning: the snapshot holds no place for it")
        elif states[path] is None:
            continue  # not begun at the snapshot's step: it starts at its beginning, as it would have
        elif isinstance(loader, DataLoader) and _has_begun(loader):
            notes.append(f"{path} ({kind}) starts from its beginning: setup() already made an iterator of it, which "
                         "the snapshot's place cannot go into; iterate the loader in a generator or in step() instead")
        else:
            try:
                loader.load_state_dict(states[path])
            except Exception as exc:  # noqa: BLE001 - a state that does not fit (another dataset, other workers)
                notes.append(f"{path} ({kind}) starts from its beginning: the snapshot's place did not fit it "
                             f"({type(exc).__name__}: {exc})")
                continue
            placed[id(loader)] = path
            if path in epochs:
                expected.append((path, loader, int(epochs[path])))
    if placed:
        notes.insert(0, f"{', '.join(placed.values())}: given back the place step {step} had left "
                        f"{'them' if len(placed) > 1 else 'it'} at (state_dict()), so the batch after the snapshot's "
                        "comes next")
    unclaimed = sorted(path for path, state in states.items() if path not in loaders and state is not None)
    if unclaimed:
        notes.append(f"the snapshot holds the place of loader(s) setup() did not make: {', '.join(unclaimed)} (not used)")
    return PutBack(placed, notes, EpochCheck(expected, step) if expected else None)


def _names(loaders: dict[str, DataLoader]) -> str:
    return ", ".join(f"{path} ({type(loader).__name__})" for path, loader in loaders.items())


def carry_places(old_state: Any, new_state: Any) -> list[str]:
    """For a rebuild: each loader setup() made again takes the place its old one had reached (the same path in the
    old state), so the data goes on rather than starting its epoch over. The rebuild's notes."""
    try:
        old, new = find_loaders(old_state), find_loaders(new_state)
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; the data starting over is said
        return [f"the data loaders' places were not carried over ({type(exc).__name__}: {exc})"]
    carried: list[str] = []
    notes: list[str] = []
    for path, loader in new.items():
        before = old.get(path)
        if before is None or before is loader or not _has_begun(before) or _has_begun(loader):
            continue
        try:
            loader.load_state_dict(before.state_dict())
        except Exception as exc:  # noqa: BLE001 - another dataset or worker count: the new loader starts over
            notes.append(f"{path} ({type(loader).__name__}) starts from its beginning: the old loader's place did not "
                         f"fit the new one ({type(exc).__name__}: {exc})")
            continue
        carried.append(path)
    if carried:
        notes.insert(0, f"{', '.join(carried)}: carried over the place the old loader had reached, so the batch after "
                        "the last step's comes next (a generator reading it starts over with its own variables)")
    return notes
