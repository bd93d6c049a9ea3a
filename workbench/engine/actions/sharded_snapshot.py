"""Snapshots of sharded state (FSDP2's `fully_shard`, DTensor parameters) through torch.distributed.checkpoint.

Each rank writes its own shard; nobody gathers the whole model. Every rank writes into one temp
folder (`.tmp-<rank 0's pid>-step-N.dcp`); once `dcp.save` has returned on rank 0 (its coordinator has
collected every rank's writes and written the metadata), rank 0 adds vram-bench's own facts
(`vram-bench.json`: step, code version) and renames the folder to `step-N.dcp`. A kill at any moment
leaves either no new snapshot or a whole one, and the previous one untouched; the temp folder is
removed at the next start (its writer's pid is gone).

Loading goes through DCP too, so a run resumed on another number of ranks gets its state resharded.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

try:  # DCP's own flattening (private): its keys exactly. Without it the optimizers are not checked ahead.
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
except ImportError:  # pragma: no cover - a torch that moved it
    flatten_state_dict = None

from workbench.engine.code_on_record import KEY as CODE_KEY
from workbench.engine.loader_places import LAYOUT, SHARDED_KEY, pack, places, state_of, unpack
from workbench.engine.moved_layers import match_moved
from workbench.engine.actions.optimizer_settings import Settings, kept_from_snapshot, settings_of
from workbench.engine.actions.plain_data_dcp import PlainDataLoadPlanner, PlainDataReader, check_values, read_metadata
from workbench.engine.actions.sharded_states import any_ranks, read_states
from workbench.engine.actions.schedulers import find_schedulers, load_schedulers, partial_resume_notes, scheduler_payload
from workbench.engine.actions.snapshot import ResumeMismatch, ResumeReport, prune_snapshots
from workbench.engine.state_walk import Namespaces, find_with_globals
from workbench.errors import UserError
from workbench.protocol.events import Snapshot

SUFFIX = ".dcp"
FACTS = "vram-bench.json"
FORMAT = "vram-bench-dcp-1"


def is_sharded(state: Any, namespaces: Namespaces = ()) -> bool:
    """True when some parameter of the state is a DTensor (FSDP2, tensor parallel), or some module is wrapped in
    FSDP1's FullyShardedDataParallel: rank 0 alone cannot save it (FSDP1's own `state_dict()` gathers every
    shard, a collective: called on rank 0 alone, it paired with the other ranks' next step and hung it)."""
    from torch.distributed.tensor import DTensor

    modules, _ = find_with_globals(state, namespaces)
    return (any(isinstance(p, DTensor) for module in modules.values() for p in module.parameters())
            or has_fsdp1(modules.values()))


def has_fsdp1(modules: Any) -> bool:
    """Whether any of these modules is, or holds, an FSDP1 FullyShardedDataParallel wrapper."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(sub, FullyShardedDataParallel) for module in modules for sub in module.modules())


def write_sharded(
    state: Any, step: int, code_version: int, run_dir: Path, writer_pid: int, is_main: bool, keep: int,
    namespaces: Namespaces = (), training_globals: dict[str, Any] | None = None,
    loader_record: dict[str, Any] | None = None, large: dict[str, torch.Tensor] | None = None,
    optimizers_as_made: Settings | None = None, code: dict[str, Any] | None = None,
) -> Snapshot:
    """Every rank at once (a lockstep command). `writer_pid`: rank 0's, the same name on every rank; rank 0 then
    keeps the run's `keep` newest snapshots, as for one process. `loader_record`: where this rank's stateful data
    loaders were (loader_places.py), under a key of this rank's own, so every rank writes its own. `large`: the
    tensors of project objects' model-sized states, under their keys (sharded_states.py)."""
    started = time.monotonic()
    folder = run_dir / "snapshots"
    final = folder / f"step-{step:08d}{SUFFIX}"
    temp = folder / f".tmp-{writer_pid}-step-{step:08d}{SUFFIX}"
    if is_main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
    state_dict = {**_state_dict(state, namespaces), **(large or {})}
    if loader_record is not None:
        # As bytes in a tensor: DCP pickles other values whole (a BytesIO too), which weights_only cannot read back.
        state_dict[SHARDED_KEY.format(rank=_rank())] = torch.frombuffer(bytearray(pack(loader_record)), dtype=torch.uint8)
    _checkpoint_call(dcp.save, state_dict, checkpoint_id=str(temp))
    if is_main:
        facts = {"format": FORMAT, "step": step, "code_version": code_version, "saved_at": time.time(),
                 "world_size": dist.get_world_size() if dist.is_initialized() else 1, "globals": dict(training_globals or {})}
        facts["schedulers"], facts["scheduler_types"] = scheduler_payload(find_schedulers(state, namespaces))  # replicated
        if optimizers_as_made is not None:
            facts["optimizers_as_made"] = optimizers_as_made  # plain numbers: JSON (tuples come back as lists)
        if code is not None:
            facts[CODE_KEY] = code  # which code the run was running (code_on_record.py)
        (temp / FACTS).write_text(_facts_json(facts))
        _fsync_tree(temp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(temp, final)
        prune_snapshots(folder, keep, protect=final)
    return Snapshot(path=str(final), bytes=folder_bytes(final) if is_main else 0, step=step,
                    seconds=time.monotonic() - started)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def read_loader_places(path: Path, rank: int, world_size: int, live: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """This rank's loader places in a sharded snapshot, in the form a one-file snapshot keeps them (None: the
    snapshot has none: written before vram-bench kept them), with rank 0's record beside it (what hands out no data
    takes rank 0's state on another number of ranks). The model-sized states of the objects in `live` are read from
    their tensors (sharded_states.py): this rank's own on the same number of ranks, the ones every rank shared on
    any. Read with no collective: each rank reads its own keys."""
    facts = read_facts(path)
    metadata = read_metadata(path)
    keys = [key for key in metadata.state_dict_metadata if key.startswith(SHARDED_KEY.split("{", 1)[0])]
    if not keys:
        return None
    saved_world_size = int(facts.get("world_size", 1))
    same_ranks = saved_world_size == world_size
    records = {r: record for r in sorted({0, rank} if same_ranks else {0})
               if (record := _read_record(path, metadata, r)) is not None}
    saved = places(records, saved_world_size)
    mine = records.get(rank) if same_ranks else None
    layout = (mine or {}).get(LAYOUT) if same_ranks else {
        p: entry for p, entry in ((records.get(0) or {}).get(LAYOUT) or {}).items() if any_ranks(p, entry)}
    if layout and live:
        states, unread = read_states(path, layout, live, state_of)
        if mine is not None:
            mine["large"], mine["differs"] = states, {**(mine.get("differs") or {}), **unread}
        else:
            saved["large"], saved["large_resharded"], saved["unread"] = states, True, unread
    return saved


def _read_record(path: Path, metadata: Any, rank: int) -> dict[str, Any] | None:
    """Rank `rank`'s loader record in the snapshot, or None when it has none."""
    key = SHARDED_KEY.format(rank=rank)
    item = metadata.state_dict_metadata.get(key)
    if item is None:
        return None
    if not isinstance(item, TensorStorageMetadata):
        raise UserError(f"{path}: {key} is not a loader record")
    holder = {key: torch.empty(tuple(item.size), dtype=torch.uint8)}
    _checkpoint_call(dcp.load, holder, storage_reader=PlainDataReader(str(path)), planner=PlainDataLoadPlanner(), no_dist=True)
    return unpack(holder[key].numpy().tobytes())


def _facts_json(facts: dict[str, Any]) -> str:
    """The facts as JSON; a tensor in a scheduler's state (a rate given as a tensor) as its numbers. A scheduler
    state JSON cannot hold is left out, and why is kept: the resume then says the schedules start over."""
    def numbers(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.tolist()
        raise TypeError(f"{type(value).__name__} is not JSON")

    try:
        return json.dumps(facts, default=numbers)
    except (TypeError, ValueError) as exc:
        dropped = {**facts, "schedulers": {}, "scheduler_types": {}, "schedulers_error": str(exc)}
        return json.dumps(dropped, default=numbers)


def read_facts(path: Path) -> dict[str, Any]:
    """The step and code version of a sharded snapshot; a UserError for a folder that is not a whole one."""
    try:
        facts = json.loads((path / FACTS).read_text())
    except (OSError, ValueError):
        raise UserError(f"{path} is not a whole vram-bench sharded snapshot (no readable {FACTS}).") from None
    if facts.get("format") != FORMAT or not (path / ".metadata").exists():
        raise UserError(f"{path} is not a whole vram-bench sharded snapshot.")
    return facts


def load_sharded(state: Any, path: Path, namespaces: Namespaces = (), partial: bool = False) -> tuple[ResumeReport, dict[str, Any]]:
    """Every rank at once: read its part of the snapshot into the live state. Returns what was loaded (the same
    report as a one-file snapshot's) and the module globals training had changed (rank 0's).

    Checked first against the snapshot's metadata, as a one-file snapshot is: a model that does not fit loads
    nothing (a ResumeMismatch naming what differs; every rank reads the same metadata, so every rank decides
    alike); with `partial`, the tensors that fit and no optimizer. DCP's own failures arrive as a
    CheckpointException, a BaseException: turned into an exception the session reports."""
    facts = read_facts(path)
    report = ResumeReport(path=str(path), step=int(facts["step"]))
    state_dict = _state_dict(state, namespaces)
    modules, optimizers = _pairs(state, namespaces)
    metadata = read_metadata(path)  # plain data only, as one-file snapshots are read (plain_data_dcp.py)
    check_values(path, metadata)
    saved = metadata.state_dict_metadata
    renamed = _to_saved_names(state_dict, saved, modules, optimizers, report)
    unfit = _compare(state_dict, saved, modules, optimizers, report)
    if not report.clean and not partial:
        raise ResumeMismatch(report)
    load = {key: value for key, value in state_dict.items() if key not in unfit["optimizers"]}
    for top, names in unfit["tensors"].items():
        load[top] = {k: v for k, v in load[top].items() if k not in names}
    _checkpoint_call(dcp.load, load, storage_reader=PlainDataReader(str(path)),
                     planner=PlainDataLoadPlanner(allow_partial_load=partial))
    for name, module in modules.items():
        back = renamed.get(f"model/{name}", {})
        set_model_state_dict(module, {back.get(k, k): v for k, v in load[f"model/{name}"].items()},
                             options=StateDictOptions(strict=not partial))
        report.tensors += len(load[f"model/{name}"])
    made = settings_of({name: optimizer for name, (_, optimizer) in optimizers.items()})
    for name, (module, optimizer) in optimizers.items():
        if f"optim/{name}" in load:
            set_optimizer_state_dict(module, optimizer,
                                     _renamed_optimizer(load[f"optim/{name}"], renamed.get(_top_of(module, modules), {})))
            report.optimizers += 1
    report.settings_notes = kept_from_snapshot(
        made, facts.get("optimizers_as_made"),
        {name: optimizer for name, (_, optimizer) in optimizers.items() if f"optim/{name}" in load}, report.step,
        list(namespaces))
    if report.clean:
        report.schedulers, report.scheduler_notes = load_schedulers(find_schedulers(state, namespaces), facts)
    else:
        report.scheduler_notes = partial_resume_notes(find_schedulers(state, namespaces))
    # Initialized as setup() does (before the load: DCP fills live shards): missing, or of another shape.
    report.initialized = [f"{top[len('model/'):]}.{renamed.get(top, {}).get(key, key)}"
                          for top, keys in unfit["tensors"].items() for key in keys]
    return report, dict(facts.get("globals") or {})


def _to_saved_names(state_dict: dict[str, Any], saved: dict[str, Any], modules: dict[str, torch.nn.Module],
                    optimizers: dict[str, Any], report: ResumeReport) -> dict[str, dict[str, str]]:
    """Layers renumbered since the snapshot (one inserted into an nn.Sequential): each model's keys, and its
    optimizer's parameter names, put under the names the snapshot has them by (moved_layers.py), in place.
    Returns {top key: {saved name: live name}} to put them back after the load."""
    renamed: dict[str, dict[str, str]] = {}
    for name in modules:
        top = f"model/{name}"
        saved_shapes = {k[len(top) + 1:]: tuple(meta.size) for k, meta in saved.items()
                        if k.startswith(f"{top}.") and isinstance(meta, TensorStorageMetadata)}
        saved_keys, moved = match_moved(saved_shapes, state_dict[top], name)
        if moved is None:
            continue
        report.moved.append(moved)
        to_saved = {key: saved_key or f"{key} (new)" for key, saved_key in saved_keys.items()}
        state_dict[top] = {to_saved[key]: value for key, value in state_dict[top].items()}
        renamed[top] = {old: new for new, old in to_saved.items()}
    for name, (module, _) in optimizers.items():
        top = _top_of(module, modules)
        if top in renamed and f"optim/{name}" in state_dict:
            to_saved = {new: old for old, new in renamed[top].items()}
            state_dict[f"optim/{name}"] = _renamed_optimizer(state_dict[f"optim/{name}"], to_saved)
    return renamed


def _top_of(module: torch.nn.Module, modules: dict[str, torch.nn.Module]) -> str:
    """The state dict key of the top module an optimizer trains (`_pairs` found it among `modules`)."""
    return next(f"model/{name}" for name, m in modules.items() if m is module)


def _renamed_optimizer(optimizer_state: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An optimizer state dict (keyed by parameter names, as get_optimizer_state_dict makes it) with its names mapped."""
    if not names:
        return optimizer_state
    return {
        **optimizer_state,
        "state": {names.get(k, k): v for k, v in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [names.get(p, p) for p in group.get("params", [])]}
                         for group in optimizer_state.get("param_groups", [])],
    }


def _compare(state_dict: dict[str, Any], saved: dict[str, Any], modules: dict[str, torch.nn.Module],
             optimizers: dict[str, Any], report: ResumeReport) -> dict[str, Any]:
    """Fill `report` with what differs between the live state and the snapshot's metadata (keys as DCP flattens
    them); returns what a partial load leaves out: {"tensors": {top key: inner keys}, "optimizers": {top keys}}."""
    unfit: dict[str, Any] = {"tensors": {}, "optimizers": set()}
    for name in modules:
        top = f"model/{name}"
        live = state_dict[top]
        for key, tensor in live.items():
            flat, shown = f"{top}.{key}", f"{name}.{key}"
            meta = saved.get(flat)
            if meta is None:
                report.missing.append(shown)
                unfit["tensors"].setdefault(top, []).append(key)
            elif isinstance(meta, TensorStorageMetadata) and tuple(meta.size) != tuple(tensor.shape):
                report.mismatched.append(f"{shown} {tuple(meta.size)} -> {tuple(tensor.shape)}")
                unfit["tensors"].setdefault(top, []).append(key)
        report.unexpected.extend(k[len("model/"):] for k in saved if k.startswith(f"{top}.") and k[len(top) + 1:] not in live)
    tops = {f"model/{name}" for name in modules}
    report.unexpected.extend(sorted({k.split(".", 1)[0][len("model/"):] + ".*" for k in saved
                                     if k.startswith("model/") and k.split(".", 1)[0] not in tops}))
    if flatten_state_dict is None:
        return unfit
    flat_live, _ = flatten_state_dict({key: value for key, value in state_dict.items() if key.startswith("optim/")})
    for name in optimizers:
        top = f"optim/{name}"
        absent = [k for k in flat_live if k.startswith(f"{top}.") and k not in saved]
        differ = [k for k, v in flat_live.items() if k.startswith(f"{top}.") and isinstance(v, torch.Tensor)
                  and isinstance(saved.get(k), TensorStorageMetadata) and tuple(saved[k].size) != tuple(v.shape)]
        if absent or differ:
            unfit["optimizers"].add(top)
            what = [f"{len(absent)} of its entries are not in the snapshot" if absent else "",
                    f"{len(differ)} differ in shape" if differ else ""]
            example = (absent or differ)[0][len(top) + 1:]
            report.mismatched.append(f"optimizer {name}: " + " and ".join(w for w in what if w) + f" (such as {example})")
    return unfit


def _checkpoint_call(call: Any, *args: Any, **kwargs: Any) -> Any:
    """DCP raises CheckpointException, a BaseException that `except Exception` does not catch (it ended the
    session as an internal error): re-raised as a RuntimeError that names each rank's failure once."""
    try:
        return call(*args, **kwargs)
    except CheckpointException as exc:
        by_message: dict[str, list[int]] = {}
        for rank, (error, _) in sorted(exc.failures.items()):
            by_message.setdefault(f"{type(error).__name__}: {error}", []).append(rank)
        said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {message}"
                         for message, ranks in by_message.items())
        raise RuntimeError(f"torch.distributed.checkpoint failed ({said})") from None


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _state_dict(state: Any, namespaces: Namespaces) -> dict[str, Any]:
    modules, optimizers = _pairs(state, namespaces)
    state_dict: dict[str, Any] = {f"model/{name}": get_model_state_dict(m) for name, m in modules.items()}
    for name, (module, optimizer) in optimizers.items():
        state_dict[f"optim/{name}"] = get_optimizer_state_dict(module, optimizer)
    return state_dict


def _pairs(state: Any, namespaces: Namespaces) -> tuple[dict[str, torch.nn.Module], dict[str, tuple[torch.nn.Module, Any]]]:
    """The top modules (not those inside another found one), and each optimizer with the module it trains."""
    modules, optimizers = find_with_globals(state, namespaces)
    inner = {id(sub) for m in modules.values() for sub in m.modules() if sub is not m}
    tops = {name: m for name, m in modules.items() if id(m) not in inner}
    paired: dict[str, tuple[torch.nn.Module, Any]] = {}
    for name, optimizer in optimizers.items():
        first = next((p for group in optimizer.param_groups for p in group["params"]), None)
        owner = next((m for m in tops.values() if any(p is first for p in m.parameters())), None)
        if owner is None:
            raise UserError(f"optimizer {name} trains parameters of no module in the state: a sharded snapshot cannot "
                            "save its state")
        paired[name] = (owner, optimizer)
    return tops, paired


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
