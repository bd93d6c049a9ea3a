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
A DTensor is always under the shared key: DCP places each rank's shard by its placements.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
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
    """What goes into the DCP state dict (each tensor under its key) and what the rank's record keeps (`LAYOUT`): each
    tensor's key, which were DTensors, and the skeleton. A DTensor is always under the shared key, where DCP puts
    each rank's shard by its placements (under a key of one rank's own, the other shards were missing and DCP
    refused the whole snapshot); a plain tensor under the rank's own key unless every rank's is the same."""
    from torch.distributed.tensor import DTensor

    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    for path, state in large.items():
        skeleton, leaves = split(state)
        keys = [f"{shared_prefix(path) if isinstance(leaf, DTensor) or path in replicated else own_prefix(path, rank)}/{i}"
                for i, leaf in enumerate(leaves)]
        tensors.update({key: leaf.detach() for key, leaf in zip(keys, leaves)})
        layout[path] = {"keys": keys, "dtensors": [i for i, leaf in enumerate(leaves) if isinstance(leaf, DTensor)],
                        "skeleton": skeleton}
    return tensors, layout


def any_ranks(path: str, entry: dict[str, Any]) -> bool:
    """Whether any number of ranks can read the state: none of its tensors is under a key of one rank's own."""
    return all(key.startswith(shared_prefix(path) + "/") for key in entry["keys"])


def read_states(snapshot: Path, layout: dict[str, Any], live: dict[str, Any], state_of: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Each large state the record lays out and this run has an object for, read from the snapshot: {path: state}
    for `put_back` to give (it checks the layout against the object's own), and {path: why} for one that cannot be
    read here. `state_of(obj)`: the object's own state, whose tensors say where and how (a DTensor's placements) each
    saved one is read: a live shard's, or, where the object has no tensor of that shape (an EMA made lazily), whole
    onto the CPU; but a saved DTensor only into a live one (whole on the CPU, its next update against the sharded
    weights would fail). Each rank reads its own part, no collective."""
    from torch.distributed.tensor import DTensor

    saved = read_metadata(snapshot).state_dict_metadata
    states: dict[str, Any] = {}
    unread: dict[str, str] = {}
    for path, entry in layout.items():
        if path not in live:
            continue
        keys, skeleton = entry["keys"], entry["skeleton"]
        metas = [saved.get(key) for key in keys]
        if not all(isinstance(meta, TensorStorageMetadata) for meta in metas):
            unread[path] = "the snapshot lacks the tensors of its state"
            continue
        shapes = join(skeleton, [torch.empty(tuple(m.size), dtype=m.properties.dtype, device="meta") for m in metas])
        template = split(_template(shapes, state_of(live[path])))[1]
        if any(not isinstance(template[i], DTensor) for i in entry.get("dtensors", ())):
            unread[path] = ("its state held DTensor shards where its own state now has none of that shape (made "
                            "lazily, or the model changed)")
            continue
        holder = dict(zip(keys, template))
        try:
            dcp.load(holder, storage_reader=PlainDataReader(str(snapshot)), planner=PlainDataLoadPlanner(), no_dist=True)
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException: said, not fatal
            if not isinstance(exc, (Exception, CheckpointException)):
                raise
            unread[path] = f"its tensors could not be read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            continue
        states[path] = join(skeleton, [holder[key] for key in keys])
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
