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
the first batches again. The same protocol keeps what is no loader at all: a hand-written EMA whose `state_dict()`
holds shadow copies of the weights. Nothing here can tell the two apart, so a project object's notes say what was
done (`load_state_dict()` given its state), not that a batch comes next. A state of more than 1 MiB of tensors is a
model's worth, not a place: a one-file snapshot writes it as tensors beside the records (`large`), not serialized into
them, and keeps rank 0's, as it keeps rank 0's models (under DDP every rank's EMA is the same; a rank whose own
differs, by a checksum rank 0 gathers, is not given rank 0's); a sharded snapshot writes its tensors through DCP,
each rank's shard, and keeps only its layout in the record (actions/sharded_states.py).
"""

from __future__ import annotations

import io
import itertools
import re
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any

import torch
from torch.utils.data import DataLoader

from workbench.engine.actions.snapshot_integrity import payload_bytes
from workbench.engine.placed_iterator import make_first_iterator_without_drawing
from workbench.engine.released_iterators import read_only_by_released
from workbench.engine.state_layout import layout_change, on_devices_of
from workbench.engine.state_walk import Namespaces, find_reachable, generator_inputs, reachable

LOADER = "loader"  # the `where` of the warning after the first resumed step (in events.WARNINGS)
SHARDED_KEY = "loader_places/rank{rank}"  # each rank's record in a sharded (DCP) snapshot: a key of its own
LAYOUT = "large_layout"  # in a sharded snapshot's record: {path: {"keys": each tensor's, "dtensors", "skeleton"}}


MAX_PLACE_TENSOR_BYTES = 1 << 20  # a project object's state above this is a model's, not a place in the data


def is_stateful(obj: Any, project_modules: frozenset[str] = frozenset()) -> bool:
    """What a snapshot keeps beside the models, optimizers and LR schedulers through `state_dict()` and
    `load_state_dict()` (torch.distributed.checkpoint's `Stateful` protocol): a DataLoader that can say where it is;
    an AMP GradScaler in use (its loss scale, which a fresh one starts over at 2**16 and then skips steps to find
    again); an object of a project class (in `project_modules`: its own loader, an EMA, a warm-up schedule); and
    one of a library's class that is not torch's (torch_ema's ExponentialMovingAverage, timm's schedulers). Not a
    library's sampler or dataset: its place is its loader's. Not an object that holds a model or a loader: a
    `Trainer` that checkpoints them all is walked into instead."""
    if isinstance(obj, torch.Generator):
        return True  # a random stream of its own (`generator=g` for a sampler, `torch.randn(..., generator=g)`)
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        return False
    if isinstance(obj, DataLoader):
        return True
    if isinstance(obj, torch.amp.GradScaler):
        return obj.is_enabled()  # a disabled one (`enabled=use_amp`) has no state
    from torch.optim.lr_scheduler import LRScheduler

    if isinstance(obj, (type, types.ModuleType, torch.nn.Module, torch.optim.Optimizer, LRScheduler)):
        return False  # each kept on its own (snapshot.py, schedulers.py)
    module = type(obj).__module__
    if module not in project_modules:
        if module == "builtins" or module == "torch" or module.startswith("torch."):
            return False
        if isinstance(obj, (torch.utils.data.Sampler, torch.utils.data.Dataset)):
            return False
    return not _holds_any(obj, (torch.nn.Module, DataLoader))


def _holds_any(obj: Any, kinds: tuple[type, ...]) -> bool:
    """Whether an attribute of `obj` (or an item of a dict or list there) is a model or a loader: then `obj` is a
    trainer that checkpoints them all, not a place in the data, and the walk goes on into it to find the loaders it
    holds. One that holds only an optimizer is a schedule of its own (timm's), kept."""
    try:
        values = list(vars(obj).values())
    except TypeError:  # no __dict__ (slots)
        return False
    for value in values:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        if isinstance(value, kinds) or any(isinstance(item, kinds) for item in list(itertools.islice(inner, 256))):
            return True
    return False


def find_loaders(state: Any, namespaces: Namespaces = (), project_modules: frozenset[str] | None = None) -> dict[str, Any]:
    """Every stateful loader in the state and the project's module globals, each once, by a path that names it the
    same way in the run that snapshots and the run that resumes (`batches(loader)`: the generator's argument).
    `project_modules`: whose classes' objects are kept too, when not the modules of `namespaces`."""
    namespaces = list(namespaces)
    if project_modules is None:
        project_modules = frozenset(name for name, _ in namespaces)
    found = find_reachable(state, namespaces, lambda obj: is_stateful(obj, project_modules), "loader",
                           stop_at=(DataLoader,), into_generators=True)
    # A plain DataLoader's own `generator=` (README's advice, so that its new iterator draws nothing from the global
    # generator): its next order is drawn from it. Not kept, a resumed or rebuilt run drew the first epoch's order again.
    plain = find_reachable(state, namespaces, _plain_loader_with_a_generator, "loader", stop_at=(DataLoader,),
                           into_generators=True)
    streams = {id(value) for value in found.values()}
    for path, loader in plain.items():
        if id(loader.generator) not in streams:
            found[f"{path}.generator"] = loader.generator
            streams.add(id(loader.generator))
    return found


def _plain_loader_with_a_generator(obj: Any) -> bool:
    return (isinstance(obj, DataLoader) and not callable(getattr(obj, "load_state_dict", None))
            and isinstance(obj.generator, torch.Generator))


def loaders_read_by(generator: GeneratorType, given: frozenset[int] = frozenset()) -> list[Any]:
    """The stateful loaders a generator was given or closes over, or that what it was given holds (imagenet's
    `epochs(state)` reads `state["train_loader"]`); and each object in `given` (by id: the project objects a resume
    gave their state) that it was given or closes over itself, a project's own loader (`batches(train_loader)`) or
    a torch.Generator it draws its rows from (`batches(task, device, rows)`).
    A project object only reached through what it was given is not taken for one it reads: an EMA in the
    `state` that `epochs(state)` is given is no loader."""
    seen: set[int] = {id(generator)}
    inputs = generator_inputs(generator, "")
    direct = [value for _, value in inputs if id(value) in given and not isinstance(value, DataLoader)
              and (isinstance(value, torch.Generator) or _hands_out_batches(value))]  # a random stream it draws from
    return direct + [loader for path, value in inputs
                     for _, loader in reachable(value, path, matches=_is_stateful_data_loader, seen=seen, depth=1,
                                                stop_at=(DataLoader,), into_generators=True)]


def _is_stateful_data_loader(obj: Any) -> bool:
    return isinstance(obj, DataLoader) and is_stateful(obj)


_ITERATOR_ATTRIBUTES = ("_iterator", "_it")  # torch's DataLoader (and torchdata's StatefulDataLoader); torchdata.nodes.Loader


def _has_begun(loader: Any) -> bool:
    """Whether iter() was ever called on it. A StatefulDataLoader's `state_dict()` makes an iterator when there is
    none (with workers, it starts them), and so does torchdata.nodes.Loader's (whose next iter() then hands out that
    iterator, the loaded state ignored): a loader never iterated (a test loader) is not asked. Anything else, with
    no iterator attribute left None, always says where it is."""
    if isinstance(loader, torch.Generator):
        return True
    if getattr(loader, "_initial_iter_for_state_dict", False) is True:
        # A StatefulDataLoader whose only iterator its own state_dict() made (accelerate's `prepare` asks at once):
        # iter() has not run, and its load_state_dict() drops that iterator for one that starts at the given place.
        return False
    return all(getattr(loader, name, True) is not None for name in _ITERATOR_ATTRIBUTES)


def _iterable(obj: Any) -> bool:
    """A loader-like object (it hands out items): asking it for its state may make an iterator (`_has_begun`)."""
    return hasattr(type(obj), "__iter__") or hasattr(type(obj), "__next__")


def _hands_out_batches(obj: Any) -> bool:
    """An iterable, or an object with a `...batch...` or `...next...` method (llm.c's `next_batch()`): a loader of the
    trainer's own, as an EMA (`update`, `copy_to`) or a schedule (`step`) is not."""
    return _iterable(obj) or any(("batch" in name or "next" in name) and callable(getattr(type(obj), name, None))
                                 for name in dir(type(obj)) if not name.startswith("_"))


def _tensor_bytes(state: Any) -> int:
    """What torch.save writes of a state's tensors (each storage once; a DTensor's shard): more than
    MAX_PLACE_TENSOR_BYTES is a model's worth (an EMA's shadow weights), written as tensors rather than serialized
    into the record."""
    return payload_bytes(state)


def kept_state_bytes(find: Callable[[], dict[str, Any]]) -> int:
    """What the objects beside the models add to a snapshot (an EMA's shadow weights), for the estimate of its time
    before one has been timed. A loader is not asked: its state_dict() may start its workers. `find`: the walk
    that finds them (`find_loaders`), which failing counts nothing."""
    try:
        found = find()
    except Exception:  # noqa: BLE001 - an estimate
        return 0
    total = 0
    for obj in found.values():
        if _iterable(obj) or isinstance(obj, torch.Generator):  # a DataLoader is iterable
            continue
        try:
            total += _tensor_bytes(obj.state_dict())
        except Exception:  # noqa: BLE001 - an estimate: what cannot be asked counts nothing
            continue
    return total


def _not_plain(state: Any) -> str | None:
    """Why a weights_only load would refuse a large state (then the whole snapshot would not load), or None. Its
    skeleton, every plain tensor an empty one, goes through the same round trip as a small state: the exact check
    of torch's allow-list (a numpy float, a defaultdict or an IntEnum pass an isinstance test and are refused),
    without copying a model's worth of tensors at every snapshot."""
    try:
        unpack(pack(_skeleton(state)))
    except Exception as exc:  # noqa: BLE001 - whatever torch refuses, said in its words
        return refusal(exc)
    return None


def refusal(exc: Exception) -> str:
    """Why a state could not be taken, in a line: what a weights_only load refuses is named (torch's own message
    starts with a paragraph on how to load it anyway, which a snapshot never does)."""
    text = str(exc)
    if (found := re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)) is not None:
        return f"it holds a {found.group(1)}, which a weights_only load refuses"
    first = re.sub(r"\x1b\[[0-9;]*m", "", text.splitlines()[0]) if text else ""
    return f"{type(exc).__name__}: {first}"


def _skeleton(value: Any) -> Any:
    """The state with each plain tensor, and each DTensor (a sharded snapshot writes those through DCP), an empty
    one: what the weights_only check round-trips, not a copy of a shard at every snapshot."""
    from torch.distributed.tensor import DTensor

    if type(value) in (torch.Tensor, torch.nn.Parameter) or isinstance(value, DTensor):
        return torch.empty(0, dtype=value.dtype)
    if type(value) in (dict, OrderedDict):  # a model's state_dict() copy is an OrderedDict, which weights_only takes
        return type(value)((key, _skeleton(item)) for key, item in value.items())
    if type(value) in (list, tuple):
        return type(value)(_skeleton(item) for item in value)
    return value  # anything else as it is: another dict subclass, a tensor subclass, a numpy value, checked whole


def record(loaders: dict[str, DataLoader]) -> dict[str, Any]:
    """This rank's places: `states` by path (None: not begun, nothing to put back), `errors` for a state that could
    not be taken or is not plain data (a snapshot is read with weights_only=True: anything else would cost the
    whole resume), and `large` for a project object's state of a model's worth of tensors (module docstring)."""
    states: dict[str, Any] = {}
    errors: dict[str, str] = {}
    epochs: dict[str, int] = {}
    large: dict[str, Any] = {}
    generators: dict[str, torch.Tensor] = {}  # a DataLoader's own `generator=` (own_generator_state)
    for path, loader in loaders.items():
        if not _has_begun(loader):
            states[path] = None
            continue
        epoch = sampler_epoch(loader)
        if epoch is not None:
            epochs[path] = epoch
        try:
            state = state_of(loader)
            held = 0 if isinstance(loader, DataLoader) else _tensor_bytes(state)
            if held and _holds_any(loader, (torch.optim.Optimizer,)):
                # A wrapper of its optimizer (fairseq's, a ScheduledOptim): its tensors are the optimizer's state,
                # which the snapshot keeps on its own (and --resume-partial leaves out); a second copy would be
                # loaded over it.
                errors[path] = "its state_dict() holds the tensors of the optimizer it wraps, which the snapshot keeps"
                continue
            if held > MAX_PLACE_TENSOR_BYTES:
                if (why := _not_plain(state)) is not None:
                    errors[path] = f"its state_dict() is not plain data: {why}"
                else:
                    large[path] = state
                continue
            unpack(pack(state))
        except Exception as exc:  # noqa: BLE001 - a loader or dataset whose state is not plain data
            errors[path] = refusal(exc)
            continue
        states[path] = state
        if (own := own_generator_state(loader)) is not None:
            generators[path] = own
    return {"states": states, "errors": errors, "epochs": epochs, "large": large, "generators": generators}


def left_out(records: dict[int, dict[str, Any]], large: dict[str, Any] | None = None) -> tuple[str, ...]:
    """What a snapshot does not keep of the places and states it found, for its event: `path: why`, another rank's
    prefixed `rank N: `, so the snapshot never reads as keeping what it does not (a path kept as rank 0's `large`
    state is kept for every rank, unless that rank's own state differs from it: `differs`)."""
    kept_whole = large or {}
    return tuple(f"{f'rank {rank}: ' if rank else ''}{path}: {why}"
                 for rank, kept in sorted(records.items())
                 for path, why in [*((p, w) for p, w in (kept.get("errors") or {}).items() if p not in kept_whole),
                                   *(kept.get("differs") or {}).items()])


def fingerprints(large: dict[str, Any]) -> dict[str, list[float]]:
    """Per large state, each tensor's shape and sum in order: equal on every rank when the state is replicated (an
    EMA of DDP's weights), as a one-file snapshot, which keeps rank 0's only, assumes."""
    found: dict[str, list[float]] = {}
    for path, state in large.items():
        sums: list[float] = []
        stack = [state]
        try:
            while stack:
                value = stack.pop()
                if isinstance(value, torch.Tensor):
                    sums.extend([*map(float, value.shape), _checksum(value)])
                elif isinstance(value, dict):
                    stack.extend(value[key] for key in sorted(value, key=str))
                elif isinstance(value, (list, tuple)):
                    stack.extend(value)
        except Exception:  # noqa: BLE001 - a tensor no sum reads (sparse, quantized): not compared, as before
            continue
        found[path] = sums
    return found


def _checksum(tensor: torch.Tensor) -> float:
    """A sum that depends on where each value is (a permutation of a loader's order sums alike), in pieces of 1M
    values so that no copy of the whole tensor is made, on its own device."""
    flat = tensor.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    piece = 1 << 20
    for start in range(0, flat.numel(), piece):
        values = flat[start:start + piece].to(torch.float64)
        weights = torch.arange(start, start + values.numel(), dtype=torch.float64, device=flat.device) % 1009 + 1
        total += (values * weights).sum()
    return float(total)


def differing(records: dict[int, dict[str, Any]]) -> None:
    """Rank 0, with every rank's record: a rank whose large state is not rank 0's (a loader's order of its own share,
    over 1 MiB) is named in its record's `differs`; a resume does not give it rank 0's, and the snapshot says so."""
    mine = records.get(0, {}).get("large_sums") or {}
    for rank, kept in records.items():
        theirs = kept.get("large_sums") or {}
        differs = {path: ("its state differs from rank 0's, and a one-file snapshot keeps rank 0's only, as it keeps "
                          "the models")
                   for path, sums in theirs.items() if rank and mine.get(path) != sums}
        if differs:
            kept["differs"] = differs


def sampler_epoch(loader: DataLoader) -> int | None:
    """The epoch a DistributedSampler (or any sampler with an int `epoch`) was last set to: it decides the order of
    the data, and the loader's state says only where in that order it is. The sampler may sit inside a batch sampler
    (accelerate's `prepare` puts its SeedableRandomSampler in one)."""
    for sampler in _samplers_of(loader):
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
    return None


def _samplers_of(loader: Any) -> list[Any]:
    """The loader's sampler, its batch sampler, and theirs (a batch sampler's `sampler`, a shard's `batch_sampler`),
    nearest first."""
    found: list[Any] = []
    waiting = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    while waiting and len(found) < 8:
        sampler = waiting.pop(0)
        if sampler is None or any(sampler is seen for seen in found):
            continue
        found.append(sampler)
        waiting.extend(getattr(sampler, name, None) for name in ("sampler", "batch_sampler"))
    return found


def pack(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def unpack(raw: bytes) -> Any:
    return torch.load(io.BytesIO(raw), weights_only=True)


def places(records: dict[int, dict[str, Any]], world_size: int, large: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a one-file snapshot keeps: each rank's record, for how many ranks they were taken, and rank 0's `large`
    states (taken out of the records before any crossed between ranks: replicated, as the models are)."""
    return {"world_size": world_size, "ranks": records, "large": large or {}}


@dataclass
class EpochCheck:
    """After the first resumed step: a loader given back its place whose sampler's epoch is not the snapshot's goes
    on from the right place in another epoch's order (the generator's own epoch count started over). Said then."""

    expected: list[tuple[str, DataLoader, int]]  # (path, loader, the sampler's epoch at the snapshot)
    step: int  # the snapshot's step
    after: str = "the resume"  # or "the rebuild", whose old loaders' epochs are the ones expected
    # loaders whose place was their epoch's end: the first step after it begins the next epoch, as the run's did
    at_epoch_end: frozenset[str] = frozenset()

    def after_step(self) -> str | None:
        wrong = [(path, now, then) for path, loader, then in self.expected
                 if (now := sampler_epoch(loader)) is not None and now != then
                 and not (path in self.at_epoch_end and now == then + 1)]
        if not wrong:
            return None
        shown = "; ".join(f"{path}'s sampler is at epoch {now}, where step {self.step} was in epoch {then}"
                          for path, now, then in wrong)
        return (f"after {self.after}, {shown}: the loader went on from its place, but in that epoch's order, so it "
                "reads other batches than the run would have. The code that counts its epochs (set_epoch()'s caller, "
                "or the sampler itself) started its count over: keep the epoch in a module global it reads (`global epoch` "
                "... `epoch += 1`), which snapshots keep")


@dataclass
class PutBack:
    """What a resume did with the loaders: those given their place (by id, their paths), the notes, and the check
    of their samplers' epochs after the first step."""

    placed: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    epoch_check: EpochCheck | None = None
    reshuffled: frozenset[int] = frozenset()  # of `placed`, those given a count of batches, not an order


def put_back(loaders: dict[str, DataLoader], saved: dict[str, Any] | None, rank: int, world_size: int,
             step: int) -> PutBack:
    """Give each fresh loader its place from the snapshot (and each project object its state): which ones, and the
    resume's notes (those that go on, and those that start over and why)."""
    if not loaders and not saved:
        return PutBack()
    if saved is None:
        return PutBack(notes=[f"{_names(loaders)}: the snapshot keeps no loader's place (it was written before "
                              "vram-bench kept them), so they start from their beginning"])
    if saved.get("error"):
        return PutBack(notes=[f"{_names(loaders)}: the snapshot's loader places could not be read ({saved['error']}), "
                              "so they start from their beginning"] if loaders else [])
    ranks = saved.get("ranks") or {}
    same_ranks = saved.get("world_size") == world_size
    mine = (ranks.get(rank) if same_ranks else None) or {"states": {}, "errors": {}}
    # A one-file snapshot's large states are rank 0's, for every rank and any number of ranks (but a rank whose own
    # differed: `differing`); a sharded one's are in each rank's own record, for the same number of ranks only.
    large: dict[str, Any] = saved.get("large") or mine.get("large") or {}
    own_differed: dict[str, str] = {**(mine.get("differs") or {}), **(saved.get("unread") or {})}
    placed: dict[int, str] = {}
    notes: list[str] = []
    given: list[str] = []
    streams: list[str] = []  # torch.Generators
    for path, loader in loaders.items():
        if path in own_differed:
            notes.append(_starts_over(path, loader, f"{own_differed[path]} (step {step})"))
        elif path in large:
            if (note := _give(loader, path, large[path], step)) is None:
                placed[id(loader)] = path
                given.append(f"{path} ({type(loader).__name__}, {_tensor_bytes(large[path]) / 2**20:.1f} MiB of tensors)")
            else:
                notes.append(note)
    rest = {path: loader for path, loader in loaders.items() if path not in large and path not in own_differed}
    if not same_ranks:
        # A place is a rank's share of the data, which another number of ranks divides otherwise; what hands out no
        # data (a GradScaler, an EMA, a schedule) is the same on every rank: rank 0's.
        shared = {path: loader for path, loader in rest.items()
                  if not isinstance(loader, (DataLoader, torch.Generator)) and not _hands_out_batches(loader)}
        first = ((ranks.get(0) or {}).get("states") or {})
        sharded_own = (ranks.get(0) or {}).get(LAYOUT) or {}  # a rank's own, the rest read into `large`
        from_rank_0 = []
        for path, loader in shared.items():
            if path in sharded_own:
                notes.append(_starts_over(path, loader, f"a sharded snapshot keeps each of its {saved.get('world_size')} "
                                                        "ranks' own state where the ranks' states differed, which "
                                                        "another number of ranks cannot take"))
            elif first.get(path) is None:
                notes.append(_starts_over(path, loader, f"rank 0's snapshot of {saved.get('world_size')} ranks holds "
                                                        "no state for it"))
            elif (note := _give(loader, path, first[path], step)) is not None:
                notes.append(note)
            else:
                placed[id(loader)] = path
                from_rank_0.append(f"{path} ({type(loader).__name__})")
        if from_rank_0:
            notes.append(f"{', '.join(from_rank_0)}: load_state_dict() given what rank 0's state_dict() held at step "
                         f"{step} (the snapshot is of {saved.get('world_size')} ranks, this run has {world_size})")
        divided = {path: loader for path, loader in rest.items() if path not in shared}
        if divided:
            notes.append(f"{_names(divided)}: the snapshot's loader places are for {saved.get('world_size')} ranks' "
                         f"shares of the data, and this run has {world_size}, so they start from their beginning")
        rest = {}
    states: dict[str, Any] = mine.get("states") or {}
    errors: dict[str, str] = mine.get("errors") or {}
    epochs: dict[str, int] = mine.get("epochs") or {}
    generators: dict[str, torch.Tensor] = mine.get("generators") or {}  # none in a snapshot of before 2026-12-01
    expected: list[tuple[str, DataLoader, int]] = []
    reshuffled: dict[str, str] = {}  # path -> the sampler that draws each epoch's order anew
    ended: set[str] = set()  # placed at their epoch's end
    counted: list[str] = []  # notes of the loaders whose own epoch count was set back
    for path, loader in rest.items():
        if path in errors:
            notes.append(_starts_over(path, loader, f"its state could not be kept at step {step} ({errors[path]})"))
        elif path not in states:
            notes.append(_starts_over(path, loader, f"the snapshot holds no {'place' if isinstance(loader, DataLoader) else 'state'} for it"))
        elif states[path] is None:
            continue  # not begun at the snapshot's step: it starts at its beginning, as it would have
        elif isinstance(loader, DataLoader) and _has_begun(loader):
            notes.append(_starts_over(path, loader, "setup() already made an iterator of it, which the snapshot's "
                                      "place cannot go into; iterate the loader in a generator or in step() instead"))
        elif (note := _give(loader, path, states[path], step, generators.get(path))) is not None:
            notes.append(note)
        else:
            placed[id(loader)] = path
            if isinstance(loader, torch.Generator):
                streams.append(path)
            elif not isinstance(loader, DataLoader):
                given.append(f"{path} ({type(loader).__name__})")
            elif path in epochs:
                expected.append((path, loader, int(epochs[path])))
                if (count := batches_handed_out(states[path])) is not None and _epoch_done(loader, count):
                    ended.add(path)
                if (note := _set_own_epoch(path, loader, int(epochs[path]))) is not None:
                    counted.append(note)
            if isinstance(loader, DataLoader) and (sampler := reshuffling_sampler(loader, states[path])) is not None:
                reshuffled[path] = sampler
    data_loaders = [path for path, loader in rest.items()
                    if id(loader) in placed and isinstance(loader, DataLoader) and path not in reshuffled]
    if reshuffled:
        notes.append(_reshuffled_note(reshuffled, f"given back how far into its epoch it was at step {step}"))
    notes.extend(counted)
    if streams:
        notes.insert(0, f"{', '.join(streams)} (torch.Generator): the random state step {step} had left "
                        f"{'them' if len(streams) > 1 else 'it'} in, put back (set_state())")
    if given:
        whose = " (rank 0's, as the models)" if saved.get("large") and world_size > 1 else ""
        if saved.get("large_resharded"):
            whose = (f" (the snapshot is of {saved.get('world_size')} ranks, this run has {world_size}: "
                     "torch.distributed.checkpoint read each rank's part)")
        notes.insert(0, f"{', '.join(given)}: load_state_dict() given what state_dict() held at step {step}{whose}")
    if data_loaders:
        notes.insert(0, f"{', '.join(data_loaders)}: given back the place step {step} had left "
                        f"{'them' if len(data_loaders) > 1 else 'it'} at (state_dict()), so the batch after the "
                        "snapshot's comes next")
    notes.extend(_workers_draw_again(rest, data_loaders, states))
    unclaimed = sorted(path for path, state in states.items() if path not in loaders and state is not None)
    if unclaimed:
        notes.append(f"the snapshot holds the place of loader(s) setup() did not make: {', '.join(unclaimed)} (not used)")
    return PutBack(placed, notes, EpochCheck(expected, step, at_epoch_end=frozenset(ended)) if expected else None,
                   frozenset(id(rest[path]) for path in reshuffled))


def _workers_draw_again(loaders: dict[str, Any], placed: list[str], states: dict[str, Any]) -> list[str]:
    """For the loaders given a place inside an epoch that read through worker processes: their workers start from
    their seeds again, and skip to the place without running the dataset's code for the samples before it, so
    random draws there (a random crop, a flip) are not the run's for the rest of that epoch. The place says which
    samples come next, not the workers' random states: torchdata's own resume does the same (pytorch-cifar's port,
    whose resumed batches held the run's labels and other crops)."""
    inside = []
    for path in placed:
        loader, count = loaders[path], batches_handed_out(states.get(path))
        if getattr(loader, "num_workers", 0) > 0 and count and not _epoch_done(loader, count):
            inside.append(path)
    if not inside:
        return []
    one = len(inside) == 1
    return [f"{', '.join(inside)}: {'its' if one else 'their'} worker processes start from their seeds again inside "
            "the epoch, so random draws in the dataset's code (a random crop or flip) for the rest of this epoch are "
            "not the run's: the place keeps which samples come next, not the workers' random states; the next epoch's "
            "draw as the run's did"]


def reshuffling_sampler(loader: Any, state: Any) -> str | None:
    """The class of the sampler that makes a loader's place a count of batches into an order drawn again: torch's
    RandomSampler keeps no state, so a StatefulDataLoader reading it (given as `sampler=`, or inside a batch sampler
    as accelerate's `prepare` puts it) keeps only how many batches its epoch handed out, and takes its place by
    running the sampler again to there. The sampler draws each epoch's order as the epoch begins (from torch's global
    random state, or from its generator as it then is), so the batches after that count are those of an order drawn
    again. None: no such sampler (torchdata's own, which a StatefulDataLoader made with shuffle=True uses, keeps its
    order; accelerate's `SeedableRandomSampler` seeds each epoch alike), or no batch of the epoch is left (the next
    epoch's order is drawn as the run's was)."""
    count = batches_handed_out(state)
    if not count or _epoch_done(loader, count):
        return None
    return next((type(sampler).__name__ for sampler in _samplers_of(loader)
                 if isinstance(sampler, torch.utils.data.RandomSampler)
                 and type(sampler).__iter__ is _RANDOM_SAMPLER_ITER), None)


def batches_handed_out(state: Any) -> int | None:
    """How many batches of its epoch a StatefulDataLoader's state says it handed out (with workers, the count at
    its last snapshot and the steps since)."""
    if not isinstance(state, dict):
        return None
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, dict):
        step, since = snapshot.get("_snapshot_step"), state.get("_steps_since_snapshot", 0)
        return step + since if isinstance(step, int) and isinstance(since, int) else None
    count = state.get("_num_yielded")
    return count if isinstance(count, int) else None


def _epoch_done(loader: Any, count: int) -> bool:
    """Whether `count` batches are the whole of the loader's epoch (its last one handed out, the end not yet met)."""
    for sized in (loader, getattr(loader, "batch_sampler", None)):  # a wrapper may not pass len() on
        try:
            return count >= len(sized)
        except TypeError:  # an iterable dataset of no length
            continue
    return False


_RANDOM_SAMPLER_ITER = torch.utils.data.RandomSampler.__iter__


def state_of(obj: Any) -> Any:
    """`state_dict()`; a torch.Generator's `get_state()`, which its `set_state()` takes back."""
    return {"rng_state": obj.get_state()} if isinstance(obj, torch.Generator) else obj.state_dict()


def _load(obj: Any, state: Any, own_generator: torch.Tensor | None = None) -> None:
    """`own_generator`: a DataLoader's `generator=` state where its place was taken (`own_generator_state`)."""
    if isinstance(obj, torch.Generator):
        obj.set_state(state["rng_state"])
    else:
        obj.load_state_dict(state)
        if isinstance(obj, DataLoader):
            make_first_iterator_without_drawing(obj, own_generator)


def own_generator_state(loader: Any) -> torch.Tensor | None:
    """The state of the torch.Generator a DataLoader was given (`generator=`), kept with its place: its sampler draws
    each next epoch's order from it (placed_iterator.py)."""
    own = getattr(loader, "generator", None) if isinstance(loader, DataLoader) else None
    return own.get_state() if isinstance(own, torch.Generator) else None


def _give(loader: Any, path: str, state: Any, step: int, own_generator: torch.Tensor | None = None) -> str | None:
    """`load_state_dict(state)`; None when it took it, else the note saying it did not. An object that hands out no
    items (an EMA, a schedule) and whose state holds tensors is compared with its own state first: an EMA of a model
    whose shapes changed since the snapshot would fail its next update on the old shadow weights. Its tensors are
    handed over on the devices its own are on: a one-file snapshot loads onto the CPU, and an EMA on a GPU whose
    `load_state_dict()` keeps what it is given would fail on a device mismatch. A loader is not asked for its state
    first: torchdata.nodes.Loader's `state_dict()` makes the iterator its next iter() hands out, the loaded state
    ignored."""
    try:
        if not isinstance(loader, DataLoader) and not _iterable(loader) and _tensor_bytes(state) > 0:
            live = state_of(loader)
            if (differs := layout_change(state, live)) is not None:
                return _starts_over(path, loader, f"the snapshot's state of step {step} does not fit its own "
                                                  f"({differs}: the model changed?), so it was not given")
            state = on_devices_of(state, live)
        _load(loader, state, own_generator)
    except Exception as exc:  # noqa: BLE001 - a state that does not fit (another dataset, other workers)
        return _starts_over(path, loader, f"the snapshot's state of step {step} did not fit it ({type(exc).__name__}: {exc})")
    return None


def _set_own_epoch(path: str, loader: Any, epoch: int) -> str | None:
    """A loader that counts its epochs itself and sets its sampler's from that count as each epoch begins
    (accelerate's `DataLoaderShard`: `set_epoch(self.iteration)`) would begin its order at epoch 0 again: its count
    is set to its sampler's epoch at the place, so the rest of that epoch, and the epochs after, are drawn in the
    run's order. The note; None for a loader with no `set_epoch()` of its own (torch's and torchdata's have none: a
    DistributedSampler's epoch is the trainer's to set)."""
    if not callable(getattr(type(loader), "set_epoch", None)):
        return None
    try:
        loader.set_epoch(epoch)
    except Exception as exc:  # noqa: BLE001 - the place stands; the epoch check after the first step says the rest
        return f"{path}: its own epoch count could not be set back to {epoch} ({type(exc).__name__}: {exc})"
    return f"{path}: its own epoch count set back to {epoch} (set_epoch()), where its sampler's order was"


def _reshuffled_note(reshuffled: dict[str, str], given: str) -> str:
    """What a loader given a count, not an order, goes on with (see `reshuffling_sampler`)."""
    names = ", ".join(f"{path} (its {sampler})" for path, sampler in reshuffled.items())
    return (f"{names}: {given} (state_dict() keeps a count of batches), not the order: its sampler draws each "
            "epoch's order as the epoch begins and keeps no state, so the batches from here to the epoch's end are "
            "the rest of an order drawn again, which need not be the run's, and drawing it takes one more draw from "
            "torch's random state, so the random draws after it (dropout) need not be the run's either. A sampler "
            "that keeps its state keeps the order (torchdata's, which a StatefulDataLoader made with shuffle=True "
            "uses); under accelerate, DataLoaderConfiguration(use_seedable_sampler=True) draws it again alike")


def _starts_over(path: str, loader: Any, why: str) -> str:
    """A DataLoader starts from its beginning; a project object (a loader, or an EMA: which, nothing here can tell)
    is left as setup() made it."""
    if isinstance(loader, DataLoader):
        return f"{path} ({type(loader).__name__}) starts from its beginning: {why}"
    return f"{path} ({type(loader).__name__}) is as setup() made it: {why}"


def _names(loaders: dict[str, DataLoader]) -> str:
    return ", ".join(f"{path} ({type(loader).__name__})" for path, loader in loaders.items())


def carry_places(old_state: Any, new_state: Any, project_modules: frozenset[str] = frozenset(),
                 step: int = 0) -> PutBack:
    """For a rebuild: each loader setup() made again takes the place its old one had reached (the same path in the
    old state), so the data goes on rather than starting its epoch over; a project object (`project_modules`' classes:
    a loader, an EMA) its old one's state, when it has the same layout. What was given (by id, for the notes on
    the generators that read them), the rebuild's notes, and the check of the new samplers' epochs against the old
    ones' (at the rebuild's `step`) after the first step."""
    try:
        old = find_loaders(old_state, project_modules=project_modules)
        new = find_loaders(new_state, project_modules=project_modules)
    except Exception as exc:  # noqa: BLE001 - the rebuild stands; the data starting over is said
        return PutBack(notes=[f"the data loaders' places were not carried over ({type(exc).__name__}: {exc})"])
    carried: list[str] = []
    reshuffled: dict[str, str] = {}  # path -> the sampler that draws each epoch's order anew
    expected: list[tuple[str, DataLoader, int]] = []  # the old samplers' epochs, checked after the first step
    ended: set[str] = set()  # carried at their epoch's end
    placed: dict[int, str] = {}
    carried_states: dict[str, Any] = {}
    given: list[str] = []  # project objects: loaders or not (an EMA), nothing here can tell
    streams: list[str] = []  # torch.Generators
    notes: list[str] = []
    for path, loader in new.items():
        before = old.get(path)
        if before is None or not _has_begun(before):
            continue
        if before is loader:
            # Not made again (a module global made at import, given to `batches(loader)`): its place goes on by itself,
            # unless the iterator it is at ends with a generator of the old state, and the new generator's iter() would
            # start a new epoch (pytorch-cifar's port: a rebuild with no change lost the StatefulDataLoader's place). Its
            # own place is then given back to it, for the next iter() to start from.
            if not read_only_by_released(loader, old_state, new_state):
                continue
        elif isinstance(loader, DataLoader) and _has_begun(loader):  # setup() made an iterator of it: no place to take
            notes.append(_starts_over(path, loader, "setup() already made an iterator of it, which the old one's "
                                      "place cannot go into; iterate the loader in a generator or in step() instead"))
            continue
        try:
            state = state_of(before)
            if (not isinstance(loader, (DataLoader, torch.Generator)) and not _iterable(loader)
                    and _tensor_bytes(state) > 0 and (differs := layout_change(state, state_of(loader)))):
                notes.append(_starts_over(path, loader, f"the old one's state does not fit the new one's ({differs}: "
                                          "the model changed?), so it was not given"))
                continue
            _load(loader, state, own_generator_state(before))
        except Exception as exc:  # noqa: BLE001 - another dataset or worker count: the new loader starts over
            notes.append(_starts_over(path, loader, f"the old one's state did not fit the new one ({type(exc).__name__}: "
                                      f"{exc})"))
            continue
        # A generator setup() seeded again goes on drawing where the old one was, as the global random states do
        # (random_states.py): as a resume at this step would.
        if isinstance(loader, DataLoader) and (epoch := sampler_epoch(before)) is not None:
            expected.append((path, loader, epoch))
            if (count := batches_handed_out(state)) is not None and _epoch_done(before, count):
                ended.add(path)
            if (note := _set_own_epoch(path, loader, epoch)) is not None:
                notes.append(note)
        if isinstance(loader, DataLoader) and (sampler := reshuffling_sampler(loader, state)) is not None:
            reshuffled[path] = sampler
        elif isinstance(loader, DataLoader):
            carried.append(path)
            carried_states[path] = state
        else:
            (streams if isinstance(loader, torch.Generator) else given).append(path)
        placed[id(loader)] = path
    if reshuffled:
        notes.append(_reshuffled_note(reshuffled, "carried over how far into its epoch the old loader was"))
    if streams:
        notes.insert(0, f"{', '.join(streams)} (torch.Generator): carried over the random state the old one had "
                        "reached (set_state())")
    if given:
        notes.insert(0, f"{', '.join(given)}: load_state_dict() given what the old one's state_dict() held")
    if carried:
        notes.insert(0, f"{', '.join(carried)}: carried over the place the old loader had reached, so the batch after "
                        "the last step's comes next (a generator reading it starts over with its own variables)")
        notes.extend(_workers_draw_again(new, carried, carried_states))
    return PutBack(placed, notes, EpochCheck(expected, step, "the rebuild", frozenset(ended)) if expected else None,
                   frozenset(id(new[path]) for path in reshuffled))
