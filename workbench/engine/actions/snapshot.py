"""Snapshots: every module, optimizer and LR scheduler in the state, written atomically; and resume from one.

Writing: temp file, flush, fsync, rename, fsync the folder; a crash at any moment
leaves either the previous snapshots or a complete new one, never a half file under
a final name. Only the last K are kept.

Reading: `torch.load(mmap=True, weights_only=True)` never unpickles arbitrary
objects, and maps the file instead of reading it, so resuming costs about one copy
of the weights (the model's own) plus file-backed pages the OS can drop.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.engine import random_states
from workbench.engine.actions.leftovers import temp_prefix
from workbench.engine.actions.optimizer_settings import Settings, kept_from_snapshot, settings_of
from workbench.engine.actions.schedulers import (
    find_schedulers,
    load_schedulers,
    partial_resume_notes,
    scheduler_payload,
    type_name,
)
from workbench.engine.actions.snapshot_integrity import check_free_space, disk_full_message, payload_bytes, verify_snapshot
from workbench.errors import UserError
from workbench.protocol.events import Snapshot
from workbench.engine.init_skipping import InitLog
from workbench.engine.moved_layers import match_moved, shapes_of
from workbench.engine.code_on_record import KEY as CODE_KEY
from workbench.engine.memory.populate import populate_for_writing
from workbench.engine.runs import LEGACY, RUNS, latest_snapshot, snapshots_by_step
from workbench.engine.state_walk import Namespaces, find_with_globals
from workbench.engine.tensor_parts import strided_parts

FORMAT = "vram-bench-snapshot/1"
DEFAULT_KEEP = 5


def snapshot_folder(run_dir: Path) -> Path:
    return run_dir / "snapshots"


def write_snapshot(
    state: Any, step: int, code_version: int, run_dir: Path, keep: int = DEFAULT_KEEP, namespaces: Namespaces = (),
    training_globals: dict[str, Any] | None = None, loader_places: dict[str, Any] | None = None,
    optimizers_as_made: Settings | None = None, code: dict[str, Any] | None = None,
) -> Snapshot:
    """`namespaces`: the project's module globals, where script-style trainers keep an optimizer or model too.
    `training_globals`: plain values step() keeps in module globals (`train.iter_num`), put back on resume.
    `loader_places`: where each stateful data loader was, every rank's (loader_places.py).
    `optimizers_as_made`: their hyperparameters as setup() made them (optimizer_settings.py).
    `code`: which code the run was running (code_on_record.py)."""
    modules, optimizers = find_with_globals(state, namespaces)
    if not modules and not optimizers:
        raise ValueError("the state returned by setup() holds no nn.Module or optimizer to snapshot")
    started = time.monotonic()
    payload = {
        "format": FORMAT,
        "step": step,
        "code_version": code_version,
        "saved_at": time.time(),
        "modules": {name: m.state_dict() for name, m in modules.items()},
        "optimizers": {name: o.state_dict() for name, o in optimizers.items()},
        # The class of each optimizer: a resume into another kind (SGD state into AdamW) is refused, not
        # accepted and then failed in the first step.
        "optimizer_types": {name: type_name(o) for name, o in optimizers.items()},
        "rng": random_states.capture(),
        "globals": dict(training_globals or {}),
    }
    payload["schedulers"], payload["scheduler_types"] = scheduler_payload(find_schedulers(state, namespaces))
    if loader_places is not None:
        payload["loader_places"] = loader_places
    if optimizers_as_made is not None:
        payload["optimizers_as_made"] = optimizers_as_made
    if code is not None:
        payload[CODE_KEY] = code
    folder = snapshot_folder(run_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"cannot write the snapshot: {folder} (or a folder above it) is not a folder any more.") from None
    needed = payload_bytes(payload)
    check_free_space(folder, needed)
    final = folder / f"step-{step:08d}.pt"
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(), suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, final)
        _fsync_folder(folder)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(exc, (OSError, RuntimeError)):
            free = shutil.disk_usage(folder).free
            if free < needed or getattr(exc, "errno", None) == errno.ENOSPC:  # torch.save says "unexpected pos ..."
                raise UserError(disk_full_message(folder, free, needed), hint="Free some space, then snapshot again.") from None
        raise
    prune_snapshots(folder, keep, protect=final)
    return Snapshot(path=str(final), bytes=final.stat().st_size, step=step, seconds=time.monotonic() - started)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prune_snapshots(folder: Path, keep: int, protect: Path) -> None:
    """Keep this run's `keep` highest steps (the folder is the run's own: no other run's file is touched)."""
    for old in [p for p in snapshots_by_step(folder) if p != protect][max(keep, 1) - 1 :]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)  # a sharded snapshot (torch.distributed.checkpoint)
        else:
            old.unlink(missing_ok=True)


def snapshots_in(folder: Path) -> list[Path]:
    """Complete snapshots in one folder, highest step first; temp files are never listed."""
    return snapshots_by_step(folder)


def find_snapshot(state_dir: Path, spec: str) -> Path:
    """`latest` → the newest run's highest step (any run of this project); otherwise a path. A UserError if none."""
    if spec == "latest":
        found = latest_snapshot(state_dir)
        if found is None:
            raise UserError(
                f"--resume latest: no snapshot in {state_dir / RUNS}/*/snapshots/ (nor in {state_dir / LEGACY}/).",
                hint="Take one with s (or the `snapshot` command) first, or pass --resume PATH.",
            )
        return found
    path = Path(spec).expanduser()
    if not (path.is_file() or (path.is_dir() and path.suffix == ".dcp")):
        raise UserError(f"--resume: no such snapshot file: {path}.",
                        hint="Use --resume latest, an existing .pt file or a sharded snapshot's .dcp folder.")
    return path.resolve()


def load_snapshot(path: Path) -> dict[str, Any]:
    """Check it (every member's CRC-32), then map it (weights only: no arbitrary object is ever unpickled).

    A damaged file is a UserError that names it and offers the previous snapshot. A sharded snapshot (a .dcp
    folder) is only checked to be whole here: every rank reads its part when it resumes."""
    if path.is_dir():
        from workbench.engine.actions.sharded_snapshot import read_facts

        facts = read_facts(path)
        return {"format": FORMAT, "sharded": str(path), "step": int(facts["step"]), "code_version": facts.get("code_version")}
    verify_snapshot(path, snapshots_in(path.parent))
    try:
        payload = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated zip, bad pickle, a file from elsewhere
        others = [p.name for p in snapshots_in(path.parent) if p != path][:3]
        hint = f"Other snapshots there: {', '.join(others)}." if others else ""
        raise UserError(f"snapshot {path} is damaged or not a snapshot ({type(exc).__name__}: {exc}).", hint=hint) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{path} is not a vram-bench snapshot (format {payload.get('format') if isinstance(payload, dict) else '?'}).")
    return payload


@dataclass
class ResumeReport:
    path: str
    step: int
    tensors: int = 0
    optimizers: int = 0
    missing: list[str] = field(default_factory=list)  # in the model, not in the snapshot
    unexpected: list[str] = field(default_factory=list)  # in the snapshot, not in the model
    mismatched: list[str] = field(default_factory=list)  # same name, other shape (or an optimizer that differs)
    initialized: list[str] = field(default_factory=list)  # not in the snapshot: initialized as setup() does
    mapped: int = 0  # tensors that took the snapshot's mapped storage (no copy)
    populated: int = 0  # bytes of those made private up front (memory/populate.py), not page by page in step 1
    schedulers: int = 0  # LR schedulers loaded (their schedule goes on where the snapshot left it)
    scheduler_notes: list[str] = field(default_factory=list)  # those that start over, and why
    settings_notes: list[str] = field(default_factory=list)  # optimizers whose hyperparameters the code now sets otherwise
    moved: list[str] = field(default_factory=list)  # notes: layers matched by their place in a renumbered container
    # Optimizers in the snapshot that setup() does not make (step() makes them on first use): loaded when they appear.
    pending_optimizers: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def problems(self, limit: int = 6) -> str:
        parts = []
        for label, names in (("missing from the snapshot", self.missing), ("not in the model", self.unexpected),
                             ("shape differs", self.mismatched)):
            if names:
                parts.append(f"{label}: {', '.join(names[:limit])}" + (f" and {len(names) - limit} more" if len(names) > limit else ""))
        return "; ".join(parts)


class ResumeMismatch(Exception):
    def __init__(self, report: ResumeReport) -> None:
        super().__init__(report.problems())
        self.report = report


def apply_snapshot(
    state: Any,
    payload: dict[str, Any],
    path: Path,
    *,
    partial: bool = False,
    namespaces: Namespaces = (),
    init_log: InitLog | None = None,
) -> ResumeReport:
    """Load the snapshot into the live modules and optimizers (found by the same names): all or nothing.

    Everything is checked before anything is touched: tensor names and shapes, each optimizer's
    class, parameter groups and the names of their hyperparameters (whose values the snapshot's run had, and
    `settings_notes` names where the code now makes others: optimizer_settings.py). On a mismatch nothing is loaded (unless `partial`:
    then the tensors that fit, and no optimizer). Loading keeps every Parameter object (optimizers
    point at them) but, where device and dtype match, gives it the snapshot's own mapped storage
    instead of copying: no second copy of the weights. Those pages are then made private in one call per
    storage (`populate.py`), so the first step does not fault on each page twice.
    `init_log`: what setup() skipped initializing (`init_skipping.py`); whatever the snapshot did not
    fill is initialized now, as setup() would have done, and named in `report.initialized`.
    An optimizer the snapshot has and setup() did not make is returned in `pending_optimizers`.
    """
    modules, optimizers = find_with_globals(state, namespaces)
    report = ResumeReport(path=str(path), step=int(payload.get("step", 0)))
    saved_modules: dict[str, dict[str, torch.Tensor]] = payload.get("modules", {})
    fills: list[tuple[torch.Tensor, torch.Tensor]] = []  # (live tensor, saved tensor)
    for name, module in modules.items():
        saved = saved_modules.get(name)
        live = module.state_dict(keep_vars=True)
        if saved is None:
            report.missing.extend(f"{name}.{k}" for k in live)
            continue
        saved_keys, moved = match_moved(shapes_of(saved), live, name)  # a layer inserted since: the rest by place
        if moved:
            report.moved.append(moved)
        found: set[str] = set()
        for key, tensor in live.items():
            saved_key = saved_keys[key]
            if saved_key is None or saved_key not in saved:
                report.missing.append(f"{name}.{key}")
                continue
            found.add(saved_key)
            was = "" if saved_key == key else f" (saved as {name}.{saved_key})"
            if tuple(saved[saved_key].shape) != tuple(tensor.shape):
                report.mismatched.append(f"{name}.{key}{was} {tuple(saved[saved_key].shape)} -> {tuple(tensor.shape)}")
            else:
                fills.append((tensor, saved[saved_key]))
        report.unexpected.extend(f"{name}.{k}" for k in saved if k not in found)
    report.unexpected.extend(f"{n}.*" for n in saved_modules if n not in modules)
    saved_optimizers = payload.get("optimizers", {})
    saved_types = payload.get("optimizer_types", {})
    for name, optimizer in optimizers.items():
        if name in saved_optimizers:
            problem = _optimizer_problem(optimizer, saved_optimizers[name], saved_types.get(name))
            if problem:
                report.mismatched.append(f"optimizer {name}: {problem}")
    if not report.clean and not partial:
        raise ResumeMismatch(report)
    if report.clean:
        made = settings_of(optimizers)
        report.optimizers = _load_optimizers(optimizers, saved_optimizers)
        report.settings_notes = kept_from_snapshot(made, payload.get("optimizers_as_made"),
                                                   {n: o for n, o in optimizers.items() if n in saved_optimizers},
                                                   report.step, list(namespaces))
        report.schedulers, report.scheduler_notes = load_schedulers(find_schedulers(state, namespaces), payload)
        report.pending_optimizers = {n: o for n, o in saved_optimizers.items() if n not in optimizers}
    else:  # a partial resume: no optimizer state, so no schedule either
        report.scheduler_notes = partial_resume_notes(find_schedulers(state, namespaces))
    report.tensors, report.mapped = _fill(fills)
    report.populated = populate_for_writing(_live_tensors(modules, optimizers), _storages_of(payload))
    if init_log is not None:
        names = {id(t): f"{m}.{k}" for m, module in modules.items() for k, t in module.state_dict(keep_vars=True).items()}
        # (one setup() made and then dropped, as a tied head's first weight, is initialized too, and not named)
        report.initialized = [names[id(p)] for p in init_log.replay(t for t, _ in fills) if id(p) in names]
    random_states.restore(payload.get("rng", {}))
    return report


def _storages_of(payload: Any) -> set[int]:
    """The data pointers of every tensor storage in a loaded payload: the snapshot file's mapped pages."""
    found: set[int] = set()
    stack = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.update(part.untyped_storage().data_ptr() for part in strided_parts(value))
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return found


def _live_tensors(modules: dict[str, torch.nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> list[torch.Tensor]:
    """What training writes: parameters, buffers and optimizer state (the storages worth making private now)."""
    tensors: list[torch.Tensor] = [t for m in modules.values() for t in m.state_dict(keep_vars=True).values()]
    for optimizer in optimizers.values():
        for state in optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return tensors


def _optimizer_problem(optimizer: torch.optim.Optimizer, saved: dict[str, Any], saved_type: str | None) -> str | None:
    """Why this saved state cannot go into `optimizer` (None if it can): found before anything is loaded."""
    if saved_type is not None and saved_type != type_name(optimizer):
        return f"the snapshot holds the state of a {saved_type.rsplit('.', 1)[-1]}, setup() made a {type(optimizer).__name__}"
    saved_groups = saved.get("param_groups", ())
    sizes = [len(g.get("params", ())) for g in saved_groups]
    live_sizes = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != live_sizes:
        return (f"the snapshot's optimizer has {_groups(sizes)}, setup() made one with {_groups(live_sizes)}: the model's "
                "parameters changed (a layer added or removed?)")
    for index, (group, live) in enumerate(zip(saved_groups, optimizer.param_groups)):
        lacking = sorted(k for k in live if k not in group and k not in _GROUP_KEYS_WITH_DEFAULTS)
        if lacking:
            return (f"group {index} of the snapshot lacks {', '.join(lacking)}: the state of another kind of "
                    f"optimizer than {type(optimizer).__name__}")
    return None


def _groups(sizes: list[int]) -> str:
    """`1 parameter group of 12 tensors`, `2 parameter groups of 8 and 2 tensors`."""
    counts = " and ".join(str(n) for n in sizes) if len(sizes) < 4 else f"{', '.join(str(n) for n in sizes[:3])}, ..."
    return f"{len(sizes)} parameter group{'' if len(sizes) == 1 else 's'} of {counts} tensors"


# Keys newer torch versions add with a default on load (`Optimizer.__setstate__`), so older snapshots lack them.
_GROUP_KEYS_WITH_DEFAULTS = frozenset({"params", "param_names", "foreach", "maximize", "capturable", "differentiable",
                                       "fused", "decoupled_weight_decay"})


def _load_optimizers(optimizers: dict[str, torch.optim.Optimizer], saved: dict[str, Any]) -> int:
    """Load each; if one fails, the ones loaded go back to what they were (setup()'s fresh state) and it raises."""
    before: list[tuple[torch.optim.Optimizer, dict[str, Any]]] = []
    try:
        for name, optimizer in optimizers.items():
            if name in saved:
                before.append((optimizer, optimizer.state_dict()))
                optimizer.load_state_dict(saved[name])  # CPU state stays the file's mapped pages (`.to()` is a no-op)
    except BaseException:
        for optimizer, state in before:
            optimizer.load_state_dict(state)
        raise
    return len(before)


def _fill(fills: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, int]:
    """Each live tensor takes its saved value; (tensors filled, of which by taking the mapped storage)."""
    done: set[int] = set()
    mapped = 0
    with torch.no_grad():
        for live, saved in fills:
            if id(live) in done:
                continue  # tied weights: one tensor under two names
            done.add(id(live))
            if live.device == saved.device and live.dtype == saved.dtype and live.layout == saved.layout:
                live.data = saved  # the same Parameter object, now on the snapshot's pages (copy-on-write)
                mapped += 1
            else:
                live.copy_(saved)  # another device or dtype: one copy, into what setup() allocated
    return len(done), mapped


def load_pending_optimizers(
    pending: dict[str, dict[str, Any]], state: Any, namespaces: Namespaces
) -> tuple[list[str], list[str]]:
    """Load each pending optimizer state into the optimizer of that name, if one exists now.

    Returns (loaded, refused) sentences; what was neither stays in `pending`.
    """
    _, optimizers = find_with_globals(state, namespaces)
    loaded, refused = [], []
    for name in [n for n in pending if n in optimizers]:
        saved = pending.pop(name)
        optimizer = optimizers[name]
        saved_groups = [len(g.get("params", ())) for g in saved.get("param_groups", ())]
        live_groups = [len(g["params"]) for g in optimizer.param_groups]
        if saved_groups != live_groups:
            refused.append(f"{name}: parameter groups {saved_groups} in the snapshot, {live_groups} live: its state was not loaded")
            continue
        try:
            optimizer.load_state_dict(saved)
        except Exception as exc:  # noqa: BLE001 - a state that does not fit leaves the fresh optimizer as it is
            refused.append(f"{name}: loading its state failed ({type(exc).__name__}: {exc})")
            continue
        loaded.append(name)
    return loaded, refused
