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
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from workbench.engine.actions.snapshot import prune_snapshots
from workbench.engine.state_walk import Namespaces, find_with_globals
from workbench.errors import UserError
from workbench.protocol.events import Snapshot

SUFFIX = ".dcp"
FACTS = "vram-bench.json"
FORMAT = "vram-bench-dcp-1"


def is_sharded(state: Any, namespaces: Namespaces = ()) -> bool:
    """True when some parameter of the state is a DTensor (FSDP2, tensor parallel): rank 0 alone cannot save it."""
    from torch.distributed.tensor import DTensor

    modules, _ = find_with_globals(state, namespaces)
    return any(isinstance(p, DTensor) for module in modules.values() for p in module.parameters())


def write_sharded(
    state: Any, step: int, code_version: int, run_dir: Path, writer_pid: int, is_main: bool, keep: int,
    namespaces: Namespaces = (), training_globals: dict[str, Any] | None = None,
) -> Snapshot:
    """Every rank at once (a lockstep command). `writer_pid`: rank 0's, the same name on every rank; rank 0 then
    keeps the run's `keep` newest snapshots, as for one process."""
    started = time.monotonic()
    folder = run_dir / "snapshots"
    final = folder / f"step-{step:08d}{SUFFIX}"
    temp = folder / f".tmp-{writer_pid}-step-{step:08d}{SUFFIX}"
    if is_main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
    dcp.save(_state_dict(state, namespaces), checkpoint_id=str(temp))
    if is_main:
        facts = {"format": FORMAT, "step": step, "code_version": code_version, "saved_at": time.time(),
                 "world_size": dist.get_world_size() if dist.is_initialized() else 1, "globals": dict(training_globals or {})}
        (temp / FACTS).write_text(json.dumps(facts))
        _fsync_tree(temp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(temp, final)
        prune_snapshots(folder, keep, protect=final)
    return Snapshot(path=str(final), bytes=folder_bytes(final) if is_main else 0, step=step,
                    seconds=time.monotonic() - started)


def read_facts(path: Path) -> dict[str, Any]:
    """The step and code version of a sharded snapshot; a UserError for a folder that is not a whole one."""
    try:
        facts = json.loads((path / FACTS).read_text())
    except (OSError, ValueError):
        raise UserError(f"{path} is not a whole vram-bench sharded snapshot (no readable {FACTS}).") from None
    if facts.get("format") != FORMAT or not (path / ".metadata").exists():
        raise UserError(f"{path} is not a whole vram-bench sharded snapshot.")
    return facts


def load_sharded(state: Any, path: Path, namespaces: Namespaces = ()) -> tuple[int, int, int, dict[str, Any]]:
    """Every rank at once: read its part of the snapshot into the live state.
    Returns (step, modules, optimizers, the module globals training changed: rank 0's)."""
    facts = read_facts(path)
    state_dict = _state_dict(state, namespaces)
    dcp.load(state_dict, checkpoint_id=str(path))
    modules, optimizers = _pairs(state, namespaces)
    for name, module in modules.items():
        set_model_state_dict(module, state_dict[f"model/{name}"])
    for name, (module, optimizer) in optimizers.items():
        set_optimizer_state_dict(module, optimizer, state_dict[f"optim/{name}"])
    return int(facts["step"]), len(modules), len(optimizers), dict(facts.get("globals") or {})


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
