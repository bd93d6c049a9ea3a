"""Find tensors that nothing in the training state owns: the leak finder.

Memory that grows step after step is almost always a tensor kept by accident:
a loss appended to a list without `.item()` (which keeps its whole autograd
graph), a cache dict on a helper object, a module-level global. The CUDA
allocator cannot say who holds a block, but Python can: every live tensor is a
gc-tracked object, and `gc.get_referrers` walks back from it to whatever keeps
it alive.

`find_leaks` takes a census of live tensors, sorts them by who owns them
(the model's parameters, buffers and grads; the optimizer's state; anything
else reachable from the user's state; or nobody), and for the largest unowned
groups names the chain of referrers that keeps one of them alive, e.g.
`("list (142 items)", "module global train.LOSSES")`.

Bytes are counted once per storage, so views do not double count, and ownership
is by storage, so a view of a parameter belongs to the model.

A loss kept with its graph keeps the graph's saved tensors alive from C++. Those
that once had a Python object still have it (PyTorch preserves it), with no
Python referrer; those that never had one are invisible to gc. Either way the
user must let go of the graph's root, so we walk the autograd graphs of unowned
tensors, add the unique unowned storages each graph saved to its root's bytes,
and do not report the saved tensors as suspects of their own.

It runs on the training thread between steps, on demand: one `gc.collect()` (so
garbage awaiting collection is not mistaken for a leak),
one pass over `gc.get_objects()`, and one `gc.get_referrers` scan per level of
referrer chain for all suspects together. The census's own lists are never
reported: they are dropped before the referrer walk, the walk's bookkeeping is
excluded by identity and type, and frames of this module are skipped.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import sys
import time
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.tensor_parts import strided_parts
from workbench.engine.memory.others_held import other_threads_held
from workbench.engine.memory.gc_freeze import thawed
from workbench.engine.memory.shards import local_shard  # a DTensor's memory: owned or not, its local tensor's storage
from workbench.engine.state_walk import find_modules_and_optimizers

MODEL = "model"
OPTIMIZER = "optimizer"
STATE = "state"
UNOWNED = "unowned"

_STATE_MAX_DEPTH = 6
_STATE_MAX_NODES = 100_000  # objects visited while walking the user's state
_GRAPH_MAX_NODES = 20_000  # autograd nodes visited while estimating graph bytes, all suspects together
_CHAIN_MAX_LEVELS = 8
_CHAIN_MAX_FRONTIER = 64  # referrers followed per level, all suspects together
_NO_REFERRERS = "no referrer that gc can see: a running function's local variable, or C++ (an autograd graph, a hook)"

_THIS_FILE = os.path.normcase(os.path.abspath(__file__.removesuffix("c")))

StorageKey = tuple[Any, ...]
GroupKey = tuple[str, str, tuple[int, ...], str]
BucketKey = tuple[str, str, tuple[int, ...], bool, str]


@dataclass(frozen=True)
class TensorGroup:
    """All live tensors with the same (device, dtype, shape, owner)."""

    device: str
    dtype: str
    shape: tuple[int, ...]
    owner: str  # MODEL, OPTIMIZER, STATE or UNOWNED
    count: int
    bytes: int  # each storage counted once, in the group of its largest view


@dataclass(frozen=True)
class Suspect:
    """Unowned tensors alike in device, dtype, shape and autograd node (a list of losses is one suspect).

    `bytes` is for all `count` tensors together: their unique storages plus the
    unique, unowned tensors their autograd graphs saved for backward (an estimate:
    the graph walk is bounded).
    """

    description: str
    bytes: int
    referrers: tuple[str, ...]  # innermost first, for one of the tensors
    count: int


@dataclass(frozen=True)
class LeakReport:
    """What `find_leaks` found; sizes are of tensors that have a Python object."""

    groups: tuple[TensorGroup, ...]  # largest first
    suspects: tuple[Suspect, ...]  # largest first
    total_bytes: int  # every storage of a live Python tensor, once
    unowned_bytes: int
    seconds: float


def find_leaks(state: Any, *, max_suspects: int = 5, namespaces: dict[str, dict] | None = None) -> LeakReport:
    """Census of live tensors, by owner, with referrer chains for the largest unowned ones.

    `namespaces` maps a display name to a module's globals, for modules that are not
    in `sys.modules` under the name the user knows (the project's entry file).
    """
    start = time.perf_counter()
    # Frozen objects are invisible to gc.get_objects and gc.get_referrers; and while the census holds every object,
    # no other thread may finish building a tuple it holds (others_held.py).
    with thawed(), other_threads_held():
        return _find_leaks(state, max_suspects, namespaces, start)


def _find_leaks(state: Any, max_suspects: int, namespaces: dict[str, dict] | None, start: float) -> LeakReport:
    gc.collect()
    owners, state_graphs = _owned_storages(state)
    census = _Census(owners)
    census.add_all(_live_tensors())
    census.add_all(state_graphs.unpacked())
    del state_graphs
    census.add_graphs()
    groups, total, unowned = census.groups()
    pending = census.top_suspects(max_suspects)
    del census  # it holds every tensor; nothing of it may be alive for the referrer walk
    chains = _referrer_chains([p.root for p in pending], _global_names(namespaces))
    suspects = tuple(
        Suspect(description=p.description, bytes=p.bytes, referrers=chain, count=p.count) for p, chain in zip(pending, chains)
        if not _torch_own_cache(chain)
    )
    return LeakReport(groups, suspects, total, unowned, time.perf_counter() - start)


def _torch_own_cache(chain: tuple[str, ...]) -> bool:
    """Held by one of torch's own module globals (DTensor's redistribution planner cache keeps each DeviceMesh's
    rank map): not the user's to let go of, so not a suspect (its bytes still count as unowned)."""
    return bool(chain) and chain[-1].startswith("module global torch.")


# --------------------------------------------------------------------------- storages


def _storages(t: torch.Tensor) -> list[tuple[StorageKey, int]]:
    """(key, nbytes) of each storage the tensor keeps alive; [] for meta tensors and ones we cannot read."""
    local = local_shard(t)
    if local is not None:
        return _storages(local)
    try:
        if t.is_meta:
            return []
        return [_strided_storage(part) for part in strided_parts(t)]
    except Exception:  # noqa: BLE001 - tensor subclasses, functional wrappers, odd layouts: leave them out
        return []


def _strided_storage(t: torch.Tensor) -> tuple[StorageKey, int]:
    storage = t.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    device = str(t.device)
    if ptr == 0:  # empty storages all sit at address 0; tell them apart by their impl
        return (device, "impl", getattr(storage, "_cdata", id(storage))), nbytes
    return (device, ptr, nbytes), nbytes


# --------------------------------------------------------------------------- ownership


def _owned_storages(state: Any) -> tuple[dict[StorageKey, str], _Graphs]:
    """Storage key -> owner for everything the user's state reaches; model beats optimizer beats state.
    Also the graphs of the state's tensors, whose saved tensors the census must count."""
    owners: dict[StorageKey, str] = {}
    modules, optimizers = find_modules_and_optimizers(state)
    for module in modules.values():
        _own_module(module, owners)
    for optimizer in optimizers.values():
        _own_optimizer(optimizer, owners)
    walk = _StateWalk(owners)
    walk.visit(state, 0)
    return owners, walk.own_graphs()


def _own(t: torch.Tensor, owner: str, owners: dict[StorageKey, str]) -> None:
    for key, _ in _storages(t):
        owners.setdefault(key, owner)


def _own_with_grad(t: torch.Tensor, owner: str, owners: dict[StorageKey, str]) -> None:
    _own(t, owner, owners)
    if t.is_leaf and t.grad is not None:  # .grad of a non-leaf warns
        _own(t.grad, owner, owners)


def _own_module(module: torch.nn.Module, owners: dict[StorageKey, str]) -> None:
    for t in itertools.chain(module.parameters(), module.buffers()):
        _own_with_grad(t, MODEL, owners)


def _own_optimizer(optimizer: torch.optim.Optimizer, owners: dict[StorageKey, str]) -> None:
    for group in optimizer.param_groups:  # parameters not in any module we found are still the model's
        for p in group.get("params", ()):
            if isinstance(p, torch.Tensor):
                _own_with_grad(p, MODEL, owners)
    for value in optimizer.state.values():
        for t in _tensors_in(value, depth=3):
            _own(t, OPTIMIZER, owners)


def _tensors_in(obj: Any, depth: int) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_in(value, depth - 1)
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors_in(value, depth - 1)


_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), range)
_SKIP_TYPES = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.GeneratorType,
    types.CoroutineType,
    types.FrameType,
    types.CodeType,
)


class _StateWalk:
    """Marks every tensor reachable from the state (dicts, sequences, attributes), bounded in depth and size."""

    def __init__(self, owners: dict[StorageKey, str]) -> None:
        self.owners = owners
        self.seen: set[int] = set()
        self.grad_fns: list[Any] = []

    def visit(self, obj: Any, depth: int) -> None:
        if depth > _STATE_MAX_DEPTH or len(self.seen) >= _STATE_MAX_NODES or id(obj) in self.seen:
            return
        if isinstance(obj, (types.GeneratorType, types.FunctionType)):
            # A data iterator in the state (its frame's locals) and a closure in the state (its
            # cells) hold tensors the state owns: the text and the batch a loader keeps.
            self.seen.add(id(obj))
            for child in _generator_or_closure_values(obj):
                self.visit(child, depth + 1)
            return
        if isinstance(obj, _LEAF_TYPES) or isinstance(obj, _SKIP_TYPES):
            return
        self.seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            _own_with_grad(obj, STATE, self.owners)
            if obj.grad_fn is not None:
                self.grad_fns.append(obj.grad_fn)
            return
        for child in self._children(obj):
            self.visit(child, depth + 1)

    def own_graphs(self) -> _Graphs:
        """What the graphs of the state's tensors saved for backward is the state's too (a kept loss)."""
        graphs = _Graphs({})
        graphs.explore(self.grad_fns)
        for key in graphs.saved_below(graphs.starts):
            self.owners.setdefault(key, STATE)
        return graphs

    def _children(self, obj: Any) -> Iterable[Any]:
        if isinstance(obj, torch.nn.Module):
            _own_module(obj, self.owners)
            return [v for sub in obj.modules() for k, v in vars(sub).items() if k not in ("_parameters", "_buffers", "_modules")]
        if isinstance(obj, torch.optim.Optimizer):
            _own_optimizer(obj, self.owners)
            return ()
        if isinstance(obj, dict):
            return list(obj.values())
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            return list(obj)
        return _attribute_values(obj)


def _generator_or_closure_values(obj: Any) -> list[Any]:
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame
        return list(frame.f_locals.values()) if frame is not None else []
    values = []
    for cell in obj.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            pass
    return values


def _attribute_values(obj: Any) -> list[Any]:
    values: list[Any] = []
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attrs = None
    if isinstance(attrs, dict):
        values.extend(attrs.values())
    for name in _slot_names(type(obj)):
        try:
            values.append(object.__getattribute__(obj, name))
        except AttributeError:
            pass
    return values


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")])
    return names


# --------------------------------------------------------------------------- census


def _live_tensors() -> list[torch.Tensor]:
    """Every live torch.Tensor Python object. Compares types against a set: `isinstance` would call `__class__`
    on every object, which wakes lazy and deprecated module attributes."""
    tensor_types = _subclasses(torch.Tensor)
    objects = gc.get_objects()
    return list(itertools.compress(objects, map(tensor_types.__contains__, map(type, objects))))


def _subclasses(cls: type) -> frozenset[type]:
    found = {cls}
    stack = [cls]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return frozenset(found)


@dataclass(frozen=True)
class _Facts:
    device: str
    dtype: str
    shape: tuple[int, ...]
    view_bytes: int
    is_base: bool  # not a view: on a tie, a storage's bytes go to its base tensor's group
    requires_grad: bool
    grad_fn: str


def _facts(t: torch.Tensor) -> _Facts | None:
    """None where a tensor subclass or layout will not say (a nested tensor has no shape)."""
    try:
        grad_fn = t.grad_fn
        return _Facts(
            device=str(t.device),
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(int(n) for n in t.shape),
            view_bytes=t.numel() * t.element_size(),
            is_base=not t._is_view(),
            requires_grad=bool(t.requires_grad),
            grad_fn=type(grad_fn).__name__ if grad_fn is not None else "",
        )
    except Exception:  # noqa: BLE001 - leave out what we cannot describe rather than fail the census
        return None


@dataclass
class _Unowned:
    tensor: torch.Tensor
    storages: list[tuple[StorageKey, int]]
    bucket: BucketKey  # unowned tensors alike in device, dtype, shape and autograd node make one suspect


@dataclass
class _Pending:
    """A suspect waiting for its referrer chain; `root` is the only reference to its tensor we keep."""

    description: str
    bytes: int
    count: int
    root: _Link


class _Census:
    """Live tensors by group, each storage counted once; unowned ones kept for the suspects."""

    def __init__(self, owners: dict[StorageKey, str]) -> None:
        self.owners = owners
        self.seen: dict[int, torch.Tensor] = {}  # keeps what we count alive, so ids stay unique
        self.counts: dict[GroupKey, int] = collections.Counter()
        self.storage_home: dict[StorageKey, tuple[tuple[int, bool], GroupKey, int]] = {}  # key -> (rank, group, nbytes)
        self.unowned: list[_Unowned] = []
        self.graphs = _Graphs(owners)

    def add_all(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            if id(t) not in self.seen:
                self.seen[id(t)] = t
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        if local_shard(t) is not None:
            return  # its local tensor, a live tensor of its own, is counted: not the global shape twice
        facts, storages = _facts(t), _storages(t)
        if facts is None or not storages:
            return
        owner = self.owners.get(storages[0][0], UNOWNED)
        group = (facts.device, facts.dtype, facts.shape, owner)
        self.counts[group] += 1
        rank = (facts.view_bytes, facts.is_base)
        for key, nbytes in storages:
            home = self.storage_home.get(key)
            if home is None or rank > home[0]:
                self.storage_home[key] = (rank, group, nbytes)
        if owner == UNOWNED:
            bucket = (facts.device, facts.dtype, facts.shape, facts.requires_grad, facts.grad_fn)
            self.unowned.append(_Unowned(t, storages, bucket))

    def add_graphs(self) -> None:
        """Walk the graphs of unowned tensors, and count what they saved for backward. Unpacking a saved
        tensor gives it a Python object that PyTorch then keeps: counting them now keeps later reports equal."""
        self.graphs.explore(u.tensor.grad_fn for u in self.unowned)
        self.add_all(self.graphs.unpacked())

    def groups(self) -> tuple[tuple[TensorGroup, ...], int, int]:
        group_bytes: dict[GroupKey, int] = collections.Counter()
        for _, group, nbytes in self.storage_home.values():
            group_bytes[group] += nbytes
        groups = sorted(
            (TensorGroup(*key, count=count, bytes=group_bytes.get(key, 0)) for key, count in self.counts.items()),
            key=lambda g: (-g.bytes, -g.count, g.owner, g.device, g.dtype, g.shape),
        )
        total = sum(g.bytes for g in groups)
        return tuple(groups), total, sum(g.bytes for g in groups if g.owner == UNOWNED)

    def top_suspects(self, limit: int) -> list[_Pending]:
        """Largest buckets first. A graph root (the loss in a list) counts what its graph saved; a tensor
        that only sits inside such a graph (a ReLU output saved for backward) is left to its root."""
        graphs = self.graphs
        buckets: dict[BucketKey, list[_Unowned]] = {}
        inner: list[_Unowned] = []
        for u in self.unowned:
            grad_fn = u.tensor.grad_fn
            is_root = grad_fn is not None and id(grad_fn) not in graphs.interior
            (buckets.setdefault(u.bucket, []) if is_root else inner).append(u)
        saved = {key: graphs.saved_below(u.tensor.grad_fn for u in members) for key, members in buckets.items()}
        held = {k for found in saved.values() for k in found}
        for u in inner:
            if not all(key in held for key, _ in u.storages):
                buckets.setdefault(u.bucket, []).append(u)
        ranked = []
        for key, members in buckets.items():
            storages = {k: n for u in members for k, n in u.storages}
            graph_bytes = sum(n for k, n in saved.get(key, {}).items() if k not in storages)
            ranked.append((sum(storages.values()) + graph_bytes, graph_bytes, key, members))
        ranked.sort(key=lambda r: (-r[0], -len(r[3])))
        return [
            _Pending(_describe(key, graph_bytes, graphs.truncated), total, len(members), _Link(members[0].tensor, None))
            for total, graph_bytes, key, members in ranked[: max(limit, 0)]
        ]


def _describe(key: BucketKey, graph_bytes: int, truncated: bool) -> str:
    device, dtype, shape, requires_grad, grad_fn = key
    parts = [f"{dtype} {list(shape)} on {device}"]
    if requires_grad:
        parts.append("requires_grad")
    if grad_fn:
        parts.append(f"grad_fn={grad_fn}")
    if graph_bytes:
        parts.append(f"its autograd graph keeps {'at least ' if truncated else ''}{_human(graph_bytes)} alive")
    return ", ".join(parts)


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


# --------------------------------------------------------------------------- autograd graphs


_NEVER_TENSORS = (int, float, bool, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
_NEVER_TENSORS += (torch.SymInt, torch.SymFloat)


class _Graphs:
    """The autograd graphs below some tensors, and the storages their nodes saved for backward.

    C++ holds saved tensors, so no Python referrer leads to them: the graph's root
    (a loss in a list) is what the user must let go of. Owned storages (a saved
    weight) are left out of `saved`. Bounded: past `_GRAPH_MAX_NODES` nodes the
    figures are lower bounds and `truncated` is set.
    """

    def __init__(self, owners: dict[StorageKey, str]) -> None:
        self.owners = owners
        self.nodes: dict[int, Any] = {}  # keeps the node wrappers alive, so their ids stay unique
        self.children: dict[int, list[int]] = {}
        self.saved: dict[int, list[tuple[StorageKey, int]]] = {}
        self.starts: list[Any] = []
        self.interior: set[int] = set()  # nodes some other node leads to
        self.truncated = False
        self._unpacked: dict[int, torch.Tensor] = {}
        self._names: dict[type, list[str]] = {}  # per node type, the attributes that may hold tensors
        self._keep: list[Any] = []  # every wrapper seen, so no id is reused while we compare ids

    def explore(self, starts: Iterable[Any]) -> None:
        stack = [node for node in starts if node is not None]
        self.starts.extend(stack)
        while stack:
            node = stack.pop()
            if id(node) in self.nodes:
                continue
            if len(self.nodes) >= _GRAPH_MAX_NODES:
                self.truncated = True
                return
            self.nodes[id(node)] = node
            saved = []
            for t in self._saved_tensors(node):
                self._unpacked.setdefault(id(t), t)
                saved.extend((k, n) for k, n in _storages(t) if k not in self.owners)
            self.saved[id(node)] = saved
            kids = [kid for kid, _ in getattr(node, "next_functions", ()) if kid is not None]
            self.children[id(node)] = [id(kid) for kid in kids]
            self.interior.update(id(kid) for kid in kids)
            self._keep.extend(kids)
            stack.extend(kids)

    def unpacked(self) -> list[torch.Tensor]:
        return list(self._unpacked.values())

    def saved_below(self, starts: Iterable[Any]) -> dict[StorageKey, int]:
        """Unique unowned storages saved by the explored nodes reachable from these."""
        found: dict[StorageKey, int] = {}
        seen: set[int] = set()
        stack = [id(node) for node in starts if node is not None]
        while stack:
            node_id = stack.pop()
            if node_id in seen or node_id not in self.nodes:
                continue
            seen.add(node_id)
            found.update(self.saved[node_id])
            stack.extend(self.children[node_id])
        return found

    def _saved_tensors(self, node: Any) -> list[torch.Tensor]:
        names = self._names.get(type(node))
        learning = names is None
        if names is None:
            names = [n for n in dir(type(node)) if n.startswith("_saved_") or n == "saved_tensors"]
        tensors: list[torch.Tensor] = []
        useful: list[str] = []
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed by backward, or a custom Function without saved tensors
                useful.append(name)
                continue
            if not _never_tensor(value):
                useful.append(name)
                tensors.extend(_tensors_in(value, depth=1))
        if learning:  # sizes, strides and scalars: skip them on the next node of this type
            self._names[type(node)] = useful
        return tensors


def _never_tensor(value: Any) -> bool:
    if isinstance(value, _NEVER_TENSORS):
        return True
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(isinstance(v, _NEVER_TENSORS) for v in value)


# --------------------------------------------------------------------------- referrer chains


class _Link:
    """One step of a referrer chain: `obj` holds `child.obj`. The walk's only container of user objects,
    so excluding this type from referrers hides all of the walk's own bookkeeping."""

    __slots__ = ("obj", "child", "root")

    def __init__(self, obj: Any, child: _Link | None, root: int = -1) -> None:
        self.obj = obj
        self.child = child
        self.root = root


def _referrer_chains(roots: list[_Link], names: dict[int, str]) -> list[tuple[str, ...]]:
    """Breadth-first up the referrers of every root together, one `gc.get_referrers` scan per level,
    until each reaches a module global."""
    for i, root in enumerate(roots):
        root.root = i
    done: dict[int, _Link] = {}
    deepest: dict[int, _Link] = {i: root for i, root in enumerate(roots)}
    visited: set[tuple[int, int]] = {(i, id(root.obj)) for i, root in enumerate(roots)}
    frontier = list(roots)
    for _ in range(_CHAIN_MAX_LEVELS):
        if not frontier:
            break
        frontier = _next_level(frontier, visited, names, done, deepest)
    chains = [_render(done.get(i) or deepest[i], names) for i in range(len(roots))]
    return [chain or (_NO_REFERRERS,) for chain in chains]


def _next_level(
    frontier: list[_Link], visited: set[tuple[int, int]], names: dict[int, str], done: dict[int, _Link], deepest: dict[int, _Link]
) -> list[_Link]:
    targets = [link.obj for link in frontier]
    mine = {id(frontier), id(targets)}
    referrers = gc.get_referrers(*targets)
    del targets
    found: list[_Link] = []
    mine.add(id(found))
    terminals: list[_Link] = []
    for referrer in referrers:
        if id(referrer) in mine or _is_own_bookkeeping(referrer):
            continue
        held = {id(x) for x in gc.get_referents(referrer)} if len(frontier) > 1 else None
        for link in frontier:
            key = (link.root, id(referrer))
            if link.root in done or key in visited or (held is not None and id(link.obj) not in held):
                continue
            visited.add(key)
            new = _Link(referrer, link, link.root)
            deepest[link.root] = new
            (terminals if _is_terminal(referrer, names) else found).append(new)
    del referrers
    for link in terminals:
        done.setdefault(link.root, link)
    return [link for link in found if link.root not in done][:_CHAIN_MAX_FRONTIER]


def _is_own_bookkeeping(obj: Any) -> bool:
    if isinstance(obj, _Link):
        return True
    if isinstance(obj, types.FrameType):
        return os.path.normcase(os.path.abspath(obj.f_code.co_filename)) == _THIS_FILE
    return False


def _is_terminal(obj: Any, names: dict[int, str]) -> bool:
    return type(obj) is dict and id(obj) in names


def _global_names(namespaces: dict[str, dict] | None) -> dict[int, str]:
    """id(globals dict) -> module name; the caller's names first, then sys.modules."""
    names: dict[int, str] = {}
    for name, namespace in (namespaces or {}).items():
        names.setdefault(id(namespace), name)
    for name, module in list(sys.modules.items()):
        if isinstance(type(module), type) and issubclass(type(module), types.ModuleType):
            namespace = module.__dict__
            if type(namespace) is dict:
                names.setdefault(id(namespace), name)
    return names


def _render(top: _Link, names: dict[int, str]) -> tuple[str, ...]:
    """Labels innermost first; a link may be folded into the one above it (an instance's __dict__)."""
    path: list[Any] = []
    link: _Link | None = top
    while link is not None:
        path.append(link.obj)
        link = link.child
    path.reverse()  # path[0] is the tensor, each next one holds the previous
    labels = [_safe_label(path, i, names) for i in range(1, len(path))]
    return tuple(label for label in labels if label)


def _safe_label(path: list[Any], i: int, names: dict[int, str]) -> str | None:
    """User objects can misbehave when asked (a dict changed by another thread, a broken __len__)."""
    try:
        return _label(path, i, names)
    except Exception:  # noqa: BLE001
        return f"{type(path[i]).__qualname__} object"


def _label(path: list[Any], i: int, names: dict[int, str]) -> str | None:
    """How `path[i]` keeps `path[i - 1]` alive; None when a neighbour says it better (an instance over its __dict__)."""
    holder, child = path[i], path[i - 1]
    above = path[i + 1] if i + 1 < len(path) else None
    if isinstance(holder, dict):
        key = _key_of(holder, child)
        if id(holder) in names:
            return f"module global {names[id(holder)]}.{key}"
        if above is not None and (_dict_of(above) is holder or _is_class_dict(above, holder, key, child)):
            return None
        return f"dict key {key!r}" if key is not None else f"dict ({len(holder)} items)"
    if isinstance(holder, (list, tuple, set, frozenset, collections.deque)):
        if isinstance(holder, tuple) and isinstance(above, types.FunctionType) and above.__closure__ is holder:
            return None
        return f"{type(holder).__name__} ({len(holder)} item{'' if len(holder) == 1 else 's'})"
    if isinstance(holder, types.CellType):
        function = path[i + 2] if i + 2 < len(path) else None
        return _closure_label(holder, above, function)
    if isinstance(holder, types.TracebackType):
        return None  # the frame below and the exception above say it
    if isinstance(holder, BaseException):
        return f"{type(holder).__qualname__} exception"
    if isinstance(holder, types.FrameType):
        name = next((k for k, v in holder.f_locals.items() if v is child), None)
        where = f"{holder.f_code.co_name} at {holder.f_code.co_filename}:{holder.f_lineno}"
        return f"local {name!r} in {where}" if name else f"frame {where}"
    if isinstance(holder, types.FunctionType):
        return None if child is holder.__closure__ else f"function {holder.__module__}.{holder.__qualname__}"
    if isinstance(holder, types.MethodType):
        return f"bound method {holder.__qualname__}"
    if isinstance(holder, (types.GeneratorType, types.CoroutineType)):
        frame = holder.gi_frame if isinstance(holder, types.GeneratorType) else holder.cr_frame
        name = next((k for k, v in frame.f_locals.items() if v is child), None) if frame is not None else None
        where = f"{type(holder).__name__} {holder.__qualname__}"
        return f"local {name!r} in {where}" if name else where
    return _attribute_label(holder, child, path[i - 2] if i >= 2 else None)


def _attribute_label(holder: Any, child: Any, grandchild: Any) -> str:
    owner = holder.__qualname__ if isinstance(holder, type) else type(holder).__qualname__
    prefix = "class attribute" if isinstance(holder, type) else "attribute"
    attrs = _dict_of(holder)
    if attrs is not None and attrs is child and grandchild is not None:  # holder -> its __dict__ -> value
        key = _key_of(attrs, grandchild)
        if key is not None:
            return f"{prefix} {owner}.{key}"
    if isinstance(holder, type):  # holder -> its class dict -> value, or holder -> value
        key = next((k for k, v in vars(holder).items() if v is child or (type(child) is dict and v is grandchild)), None)
    else:
        key = _key_of(attrs, child) if attrs is not None else None
        key = key or next((n for n in _slot_names(type(holder)) if _slot_value(holder, n) is child), None)
    return f"{prefix} {owner}.{key}" if key is not None else f"{owner} object"


def _closure_label(cell: types.CellType, closure: Any, function: Any) -> str:
    if isinstance(function, types.FunctionType) and function.__closure__ is closure:
        index = next((i for i, c in enumerate(closure) if c is cell), None)
        if index is not None:
            name = function.__code__.co_freevars[index]
            return f"closure variable {name!r} of {function.__module__}.{function.__qualname__}"
    return "closure cell"


def _dict_of(obj: Any) -> dict | None:
    if isinstance(obj, type):
        return None
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return attrs if type(attrs) is dict else None


def _is_class_dict(cls: Any, holder: dict, key: Any, value: Any) -> bool:
    return isinstance(cls, type) and key is not None and vars(cls).get(key) is value


def _slot_value(obj: Any, name: str) -> Any:
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return None


def _key_of(mapping: Any, value: Any) -> Any:
    items = dict.items(mapping) if isinstance(mapping, dict) else mapping.items()
    for key, candidate in list(items):
        if candidate is value:
            return key
    return None
