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
is by storage, so a view of a parameter belongs to the model. Tensors that only
C++ holds (the tensors an autograd graph saved for backward) have no Python
object and so are not in the census; for unowned tensors that carry a graph we
walk it and add the unique, unowned saved tensors to the suspect's bytes.

It runs on the training thread between steps, on demand: one `gc.collect()`,
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

from workbench.state_walk import find_modules_and_optimizers

MODEL = "model"
OPTIMIZER = "optimizer"
STATE = "state"
UNOWNED = "unowned"

_STATE_MAX_DEPTH = 6
_STATE_MAX_NODES = 100_000  # objects visited while walking the user's state
_GRAPH_MAX_NODES = 20_000  # autograd nodes visited while estimating graph bytes, all suspects together
_CHAIN_MAX_LEVELS = 6
_CHAIN_MAX_FRONTIER = 64  # referrers followed per level, all suspects together
_NO_REFERRERS = "no Python referrers: held from C++ (an autograd graph, a hook or an extension)"

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
    gc.collect()
    owners = _owned_storages(state)
    census = _Census(owners)
    census.add_all(_live_tensors())
    groups, total, unowned = census.groups()
    pending = census.top_suspects(max_suspects)
    del census  # it holds every tensor; nothing of it may be alive for the referrer walk
    _materialize_frames()
    chains = _referrer_chains([p.root for p in pending], _global_names(namespaces))
    suspects = tuple(
        Suspect(description=p.description, bytes=p.bytes, referrers=chain, count=p.count) for p, chain in zip(pending, chains)
    )
    return LeakReport(groups, suspects, total, unowned, time.perf_counter() - start)


# --------------------------------------------------------------------------- storages


def _storages(t: torch.Tensor) -> list[tuple[StorageKey, int]]:
    """(key, nbytes) of each storage the tensor keeps alive; [] for meta tensors and ones we cannot read."""
    try:
        if t.is_meta:
            return []
        layout = t.layout
        if layout == torch.strided:
            return [_strided_storage(t)]
        return [_strided_storage(part) for part in _sparse_parts(t, layout)]
    except Exception:  # noqa: BLE001 - tensor subclasses, functional wrappers, odd layouts: leave them out
        return []


def _strided_storage(t: torch.Tensor) -> tuple[StorageKey, int]:
    storage = t.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    device = str(t.device)
    if ptr == 0:  # empty storages all sit at address 0; tell them apart by their impl
        return (device, "impl", getattr(storage, "_cdata", id(storage))), nbytes
    return (device, ptr, nbytes), nbytes


def _sparse_parts(t: torch.Tensor, layout: torch.layout) -> list[torch.Tensor]:
    if layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return []


# --------------------------------------------------------------------------- ownership


def _owned_storages(state: Any) -> dict[StorageKey, str]:
    """Storage key -> owner for everything the user's state reaches; model beats optimizer beats state."""
    owners: dict[StorageKey, str] = {}
    modules, optimizers = find_modules_and_optimizers(state)
    for module in modules.values():
        _own_module(module, owners)
    for optimizer in optimizers.values():
        _own_optimizer(optimizer, owners)
    walk = _StateWalk(owners)
    walk.visit(state, 0)
    walk.own_graphs()
    return owners


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

    def own_graphs(self) -> None:
        """What the graphs of the state's tensors saved for backward is the state's too (a kept loss)."""
        graphs = _Graphs({})
        graphs.explore(self.grad_fns)
        for key in graphs.saved_below(graphs.starts):
            self.owners.setdefault(key, STATE)

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
    return [obj for obj in gc.get_objects() if type(obj) in tensor_types]


def _subclasses(cls: type) -> frozenset[type]:
    found = {cls}
    stack = [cls]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return frozenset(found)


@dataclass
class _Bucket:
    """Unowned tensors alike enough to be one suspect."""

    tensors: list[torch.Tensor]
    storages: dict[StorageKey, int]


@dataclass
class _Pending:
    """A suspect waiting for its referrer chain; `root` is the only reference to its tensor we keep."""

    description: str
    bytes: int
    count: int
    root: _Link


class _Census:
    def __init__(self, owners: dict[StorageKey, str]) -> None:
        self.owners = owners
        self.counts: dict[GroupKey, int] = collections.Counter()
        self.storage_home: dict[StorageKey, tuple[int, GroupKey, int]] = {}  # key -> (view bytes, group, nbytes)
        self.buckets: dict[BucketKey, _Bucket] = {}

    def add_all(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self.add(t)

    def add(self, t: torch.Tensor) -> None:
        storages = _storages(t)
        if not storages:
            return
        device, dtype, shape = str(t.device), str(t.dtype).removeprefix("torch."), tuple(t.shape)
        owner = self.owners.get(storages[0][0], UNOWNED)
        group = (device, dtype, shape, owner)
        self.counts[group] += 1
        view_bytes = t.numel() * t.element_size()
        for key, nbytes in storages:
            home = self.storage_home.get(key)
            if home is None or view_bytes > home[0]:
                self.storage_home[key] = (view_bytes, group, nbytes)
        if owner == UNOWNED:
            grad_fn = t.grad_fn
            bucket_key = (device, dtype, shape, t.requires_grad, type(grad_fn).__name__ if grad_fn is not None else "")
            bucket = self.buckets.setdefault(bucket_key, _Bucket([], {}))
            bucket.tensors.append(t)
            bucket.storages.update(storages)

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
        """Largest buckets first, counting each graph root's saved tensors with it; tensors that only
        sit inside those graphs (a ReLU output saved for backward) are left to their root."""
        graphs = _Graphs(self.owners)
        graphs.explore(t.grad_fn for bucket in self.buckets.values() for t in bucket.tensors)
        held_by_graphs = graphs.saved_below(node for node in graphs.starts if id(node) not in graphs.interior)
        ranked = []
        for key, bucket in self.buckets.items():
            if _inside_graphs(bucket, graphs, held_by_graphs):
                continue
            saved = graphs.saved_below(t.grad_fn for t in bucket.tensors)
            graph_bytes = sum(nbytes for k, nbytes in saved.items() if k not in bucket.storages)
            ranked.append((sum(bucket.storages.values()) + graph_bytes, graph_bytes, key, bucket))
        ranked.sort(key=lambda r: (-r[0], -len(r[3].tensors)))
        return [
            _Pending(_describe(key, graph_bytes, graphs.truncated), total, len(bucket.tensors), _Link(bucket.tensors[0], None))
            for total, graph_bytes, key, bucket in ranked[: max(limit, 0)]
        ]


def _inside_graphs(bucket: _Bucket, graphs: _Graphs, held: dict[StorageKey, int]) -> bool:
    """Every tensor is saved by an unowned graph and is no graph's root (PyTorch keeps the Python object of a
    saved tensor alive after its last Python reference goes, so these show up in the census)."""
    return all(
        (t.grad_fn is None or id(t.grad_fn) in graphs.interior) and all(key in held for key, _ in _storages(t))
        for t in bucket.tensors
    )


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
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# --------------------------------------------------------------------------- autograd graphs


class _Graphs:
    """The autograd graphs below some tensors, and the storages their nodes saved for backward.

    C++ holds saved tensors, so no Python referrer leads to them: the graph's root
    (a loss in a list) is what the user must let go of. Owned storages (a saved
    weight) are left out. Bounded: past `_GRAPH_MAX_NODES` nodes the figures are
    lower bounds and `truncated` is set.
    """

    def __init__(self, owners: dict[StorageKey, str]) -> None:
        self.owners = owners
        self.nodes: dict[int, Any] = {}  # keeps the node wrappers alive, so their ids stay unique
        self.children: dict[int, list[int]] = {}
        self.saved: dict[int, list[tuple[StorageKey, int]]] = {}
        self.starts: list[Any] = []
        self.interior: set[int] = set()  # nodes some other node leads to
        self.truncated = False
        self._saved_names: dict[type, tuple[str, ...]] = {}
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
            self.saved[id(node)] = [(k, n) for k, n in self._saved_storages(node) if k not in self.owners]
            kids = [kid for kid, _ in getattr(node, "next_functions", ()) if kid is not None]
            self.children[id(node)] = [id(kid) for kid in kids]
            self.interior.update(id(kid) for kid in kids)
            self._keep.extend(kids)
            stack.extend(kids)

    def saved_below(self, starts: Iterable[Any]) -> dict[StorageKey, int]:
        """Unique storages saved by the explored nodes reachable from these."""
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

    def _saved_storages(self, node: Any) -> Iterator[tuple[StorageKey, int]]:
        names = self._saved_names.get(type(node))
        if names is None:
            names = tuple(n for n in dir(type(node)) if n.startswith("_saved_") or n == "saved_tensors")
            self._saved_names[type(node)] = names
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed by backward, or a custom Function without saved tensors
                continue
            for t in _tensors_in(value, depth=1):
                yield from _storages(t)


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
    until each reaches a module global or a frame."""
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
    for link in sorted(terminals, key=lambda l: not isinstance(l.obj, dict)):  # a module global beats a frame
        done.setdefault(link.root, link)
    return [link for link in found if link.root not in done][:_CHAIN_MAX_FRONTIER]


def _materialize_frames() -> None:
    """Since Python 3.11 a running function's locals are invisible to gc until its frame object exists;
    asking for the frames creates them (they live as long as the calls), so the walk can name a caller's local."""
    for frame in sys._current_frames().values():
        while frame is not None:
            frame = frame.f_back


def _is_own_bookkeeping(obj: Any) -> bool:
    if isinstance(obj, _Link):
        return True
    if isinstance(obj, types.FrameType):
        return os.path.normcase(os.path.abspath(obj.f_code.co_filename)) == _THIS_FILE
    return False


def _is_terminal(obj: Any, names: dict[int, str]) -> bool:
    return isinstance(obj, types.FrameType) or (type(obj) is dict and id(obj) in names)


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
    labels = [_label(path, i, names) for i in range(1, len(path))]
    return tuple(label for label in labels if label)


def _label(path: list[Any], i: int, names: dict[int, str]) -> str | None:
    """How `path[i]` keeps `path[i - 1]` alive; None when a neighbour says it better (an instance over its __dict__)."""
    holder, child = path[i], path[i - 1]
    above = path[i + 1] if i + 1 < len(path) else None
    if isinstance(holder, dict):
        key = _key_of(holder, child)
        if id(holder) in names:
            return f"module global {names[id(holder)]}.{key}"
        if above is not None and _dict_of(above) is holder:
            return None
        return f"dict key {key!r}" if key is not None else f"dict ({len(holder)} items)"
    if isinstance(holder, (list, tuple, set, frozenset, collections.deque)):
        if isinstance(holder, tuple) and isinstance(above, types.FunctionType) and above.__closure__ is holder:
            return None
        return f"{type(holder).__name__} ({len(holder)} item{'' if len(holder) == 1 else 's'})"
    if isinstance(holder, types.CellType):
        function = path[i + 2] if i + 2 < len(path) else None
        return _closure_label(holder, above, function)
    if isinstance(holder, types.FrameType):
        name = next((k for k, v in holder.f_locals.items() if v is child), None)
        where = f"{holder.f_code.co_name} at {holder.f_code.co_filename}:{holder.f_lineno}"
        return f"local {name!r} in {where}" if name else f"frame {where}"
    if isinstance(holder, types.FunctionType):
        return None if child is holder.__closure__ else f"function {holder.__module__}.{holder.__qualname__}"
    if isinstance(holder, types.MethodType):
        return f"bound method {holder.__qualname__}"
    if isinstance(holder, (types.GeneratorType, types.CoroutineType)):
        return f"{type(holder).__name__} {holder.__qualname__}"
    return _attribute_label(holder, child, path[i - 2] if i >= 2 else None)


def _attribute_label(holder: Any, child: Any, grandchild: Any) -> str:
    owner = holder.__qualname__ if isinstance(holder, type) else type(holder).__qualname__
    prefix = "class attribute" if isinstance(holder, type) else "attribute"
    attrs = _dict_of(holder)
    if attrs is not None and attrs is child and grandchild is not None:  # holder -> its __dict__ -> value
        key = _key_of(attrs, grandchild)
        if key is not None:
            return f"{prefix} {owner}.{key}"
    if isinstance(holder, type):
        key = next((k for k, v in vars(holder).items() if v is child), None)
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


def _slot_value(obj: Any, name: str) -> Any:
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return None


def _key_of(mapping: dict, value: Any) -> Any:
    for key, candidate in mapping.items():
        if candidate is value:
            return key
    return None
