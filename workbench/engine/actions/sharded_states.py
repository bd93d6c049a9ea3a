"""A project object's model-sized state (an EMA of sharded weights) in a sharded snapshot, as tensors DCP writes.

An EMA of an FSDP2 model holds DTensor shadows: a shard of a model's worth on every rank. It used to be serialized
into the rank's loader record (torch.save into bytes, then a tensor of those bytes): a second host copy of the shard
at every snapshot, and a state no other number of ranks could take. Now each tensor of the state goes into the DCP
state dict under a key of its own, as the models' do, and only its skeleton (the state with each tensor an empty
one) stays in the record. So DCP writes each shard from where it lies, and reads it back resharded.

Which key: DCP takes a plain tensor saved under one key by several ranks as replicated and writes one rank's. That
holds for an EMA of DDP-style replicated weights, not for a state of a rank's own (a shadow of `to_local()` shards).
Rank 0 compares every rank's checksum of the plain tensors and non-tensor values (a collective; a sharded snapshot
is taken by every rank at one boundary) and says which states are the same everywhere: those go under a shared key
(`vram-bench/state/<path>/<i>`), which any number of ranks can read (DTensors resharded, plain tensors whole); the
rest under a key of the rank's own (`vram-bench/state/rank<r>/<path>/<i>`), which only the same number of ranks can.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from workbench.engine.actions.plain_data_dcp import PlainDataLoadPlanner, PlainDataReader, read_metadata
from workbench.engine.loader_places import fingerprints


def shared_prefix(path: str) -> str:
    return f"vram-bench/state/{path}"


def own_prefix(path: str, rank: int) -> str:
    return f"vram-bench/state/rank{rank}/{path}"


def split(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """The state with every tensor an empty one of its dtype (what the record keeps), and its tensors in the order
    `join` puts them back (dicts by their order, lists and tuples by index)."""
    leaves: list[torch.Tensor] = []

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            leaves.append(value)
            return torch.empty(0, dtype=value.dtype)
        if type(value) in (dict, OrderedDict):  # a copy of a model's state_dict() is an OrderedDict
            return type(value)((key, walk(item)) for key, item in value.items())
        if type(value) in (list, tuple):
            return type(value)(walk(item) for item in value)
        return value

    return walk(state), leaves


def join(skeleton: Any, leaves: list[torch.Tensor]) -> Any:
    """`split` undone: the skeleton with its tensors, in order, from `leaves`."""
    remaining = iter(leaves)

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return next(remaining)
        if type(value) in (dict, OrderedDict):
            return type(value)((key, walk(item)) for key, item in value.items())
        if type(value) in (list, tuple):
            return type(value)(walk(item) for item in value)
        return value

    return walk(skeleton)


def replicated_paths(large: dict[str, Any], plane: Any) -> set[str]:
    """The large states that are the same on every rank, by their plain tensors' checksums and non-tensor values
    (DTensors are DCP's to place): rank 0 decides for all, so every rank writes under the same keys. Two collectives
    on the control group."""
    mine = {path: [fingerprints({path: _plain_part(state)}).get(path), repr(split(state)[0])]
            for path, state in large.items()}
    every = plane.gather_json(mine)
    decided = None
    if plane.rank == 0:
        decided = sorted(path for path in large if all((theirs or {}).get(path) == mine[path] for theirs in every))
    return set(plane.broadcast_json(decided))


def _plain_part(state: Any) -> Any:
    """The state's plain tensors (a DTensor's value is its shards', which differ by design): None in its place."""
    from torch.distributed.tensor import DTensor

    skeleton, leaves = split(state)
    return join(skeleton, [None if isinstance(leaf, DTensor) else leaf for leaf in leaves])  # type: ignore[list-item]


def tensors_and_layout(large: dict[str, Any], rank: int, replicated: set[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What goes into the DCP state dict (each tensor under its key) and what the rank's record keeps (`LAYOUT`)."""
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    for path, state in large.items():
        prefix = shared_prefix(path) if path in replicated else own_prefix(path, rank)
        skeleton, leaves = split(state)
        tensors.update({f"{prefix}/{i}": leaf.detach() for i, leaf in enumerate(leaves)})
        layout[path] = {"key": prefix, "skeleton": skeleton}
    return tensors, layout


def read_states(snapshot: Path, layout: dict[str, Any], live: dict[str, Any], state_of: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Each large state the record lays out and this run has an object for, read from the snapshot: {path: state}
    for `put_back` to give (it checks the layout against the object's own), and {path: why} for one that cannot be
    read here (a rank's own state, and no such rank now). `state_of(obj)`: the object's own state, whose tensors say
    where and how (a DTensor's placements) each saved one is read: a live shard's, or, where the object has no tensor
    of that shape (an EMA made lazily), whole onto the CPU. Each rank reads its own part, no collective."""
    saved = read_metadata(snapshot).state_dict_metadata
    states: dict[str, Any] = {}
    unread: dict[str, str] = {}
    for path, entry in layout.items():
        if path not in live:
            continue
        prefix, skeleton = entry["key"], entry["skeleton"]
        count = len(split(skeleton)[1])
        metas = [saved.get(f"{prefix}/{i}") for i in range(count)]
        if not all(isinstance(meta, TensorStorageMetadata) for meta in metas):
            unread[path] = f"the snapshot lacks the tensors of its state ({prefix})"
            continue
        shapes = join(skeleton, [torch.empty(tuple(m.size), dtype=m.properties.dtype, device="meta") for m in metas])
        template = split(_template(shapes, state_of(live[path])))[1]
        holder = {f"{prefix}/{i}": tensor for i, tensor in enumerate(template)}
        dcp.load(holder, storage_reader=PlainDataReader(str(snapshot)), planner=PlainDataLoadPlanner(), no_dist=True)
        states[path] = join(skeleton, [holder[f"{prefix}/{i}"] for i in range(count)])
    return states, unread


def _template(saved: Any, live: Any) -> Any:
    """The saved state's shapes (meta tensors) made real: where the live state has a tensor of the same shape and
    dtype at the same place, an empty one like it (its device, a DTensor's placements: DCP reads the shard); else a
    whole one on the CPU."""
    if isinstance(saved, torch.Tensor):
        if isinstance(live, torch.Tensor) and live.shape == saved.shape and live.dtype == saved.dtype:
            return torch.empty_like(live)
        return torch.empty(saved.shape, dtype=saved.dtype)
    if type(saved) in (dict, OrderedDict):
        return type(saved)((key, _template(value, live.get(key) if isinstance(live, dict) else None))
                           for key, value in saved.items())
    if type(saved) in (list, tuple):
        return type(saved)(_template(value, live[i] if isinstance(live, (list, tuple)) and i < len(live) else None)
                           for i, value in enumerate(saved))
    return saved
