"""Rebuild: run setup() again with new code and carry the trained state over.

Parameters and buffers move by module path and tensor name when the shapes
match; optimizer state follows its parameters. What did not match is reported,
never guessed. A parameter holding NaN/Inf or garbage (`uninitialized.py`) is
not carried: the rebuild that follows a fixed initialization would bring the
garbage back. A carried tensor takes the old one's storage (same device and
dtype) rather than a copy of it (a sharded one, FSDP2's, is copied shard by
shard into the storage FSDP2 made for the new one), and setup() runs with
initialization skipped (`init_skipping.py`), so a rebuild needs memory only
for what is new.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from workbench.engine.memory.shards import local_shard
from workbench.engine.moved_layers import match_moved, shapes_of
from workbench.engine.state_walk import Namespaces, find_with_globals
from workbench.engine.uninitialized import holds_garbage


@dataclass
class CarryReport:
    tensors: int = 0
    optimizer_states: int = 0
    new: list[str] = field(default_factory=list)  # in the new state only: freshly initialised
    mismatched: list[str] = field(default_factory=list)  # same name, other shape: freshly initialised
    dropped: list[str] = field(default_factory=list)  # in the old state only: gone
    garbage: list[str] = field(default_factory=list)  # old parameters holding NaN/Inf or absurd values: not carried
    unmatched_modules: list[str] = field(default_factory=list)
    shared: int = 0  # carried by handing the old storage over (same device and dtype), not copied
    carried: list[torch.Tensor] = field(default_factory=list, repr=False)  # the new tensors that got old values
    restarted: list[str] = field(default_factory=list)  # optimizers whose state spans all their parameters, not carried
    moved: list[str] = field(default_factory=list)  # notes: layers carried by their place in a renumbered container
    # id of each old parameter carried -> the new parameter it went to (what optimizers are moved along)
    param_map: dict[int, torch.nn.Parameter] = field(default_factory=dict, repr=False)
    old_names: dict[int, str] = field(default_factory=dict, repr=False)  # id of an old parameter -> its name


def _by_every_name(modules: dict[str, torch.nn.Module], namespaces: Namespaces) -> dict[str, torch.nn.Module]:
    """Every name a model goes by: its path in the state, and each global that holds it (`train.model`):
    setup() may return it in the state on one run and keep it only in a global on the next."""
    named = dict(modules)
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if isinstance(value, torch.nn.Module) and not key.startswith("__"):
                named.setdefault(f"{module_name}.{key}", value)
    return named


def carry_over(old_state: Any, new_state: Any, old_namespaces: Namespaces = (), new_namespaces: Namespaces = ()) -> CarryReport:
    """`old_namespaces`: the project's module globals as they were before setup() ran again (copies: setup()
    re-binds `global model`), `new_namespaces` as they are now; a model only a global holds is carried too,
    matched by its path in the state or by the global that holds it."""
    old_namespaces, new_namespaces = list(old_namespaces), list(new_namespaces)
    report = CarryReport()
    old_modules, old_optimizers = find_with_globals(old_state, old_namespaces)
    new_modules, new_optimizers = find_with_globals(new_state, new_namespaces)
    old_named = _by_every_name(old_modules, old_namespaces)
    new_named = _by_every_name({}, new_namespaces)
    matched_old: set[int] = set()
    with torch.no_grad():
        for path, new_module in new_modules.items():
            aliases = [path, *(name for name, m in new_named.items() if m is new_module and name != path)]
            old_module = next((old_named[a] for a in aliases if a in old_named), None)
            if old_module is None:
                report.unmatched_modules.append(path)
                continue
            matched_old.add(id(old_module))
            if old_module is new_module:
                report.param_map.update({id(p): p for p in new_module.parameters()})
                continue  # the same object (a global setup() does not make again): nothing to carry
            old_tensors = old_module.state_dict(keep_vars=True)
            new_tensors = new_module.state_dict(keep_vars=True)
            old_keys, moved = match_moved(shapes_of(old_tensors), new_tensors, path)
            if moved:
                report.moved.append(moved)
            found: set[str] = set()
            for name, tensor in new_tensors.items():
                full = f"{path}.{name}"
                old_key = old_keys[name]
                source = old_tensors.get(old_key) if old_key is not None else None
                if source is None:
                    report.new.append(full)
                    continue
                found.add(old_key)
                was = "" if old_key == name else f" (was {path}.{old_key})"
                if source.shape != tensor.shape:
                    report.mismatched.append(f"{full}{was} {tuple(source.shape)} -> {tuple(tensor.shape)}")
                elif isinstance(source, torch.nn.Parameter) and holds_garbage(source):
                    report.garbage.append(full)  # carried, it would keep the loss NaN: setup()'s new value stays
                else:
                    if local_shard(tensor) is not None or local_shard(source) is not None:
                        _copy_sharded(source, tensor)  # FSDP2 owns the new shard's storage: written in place
                    elif tensor.device == source.device and tensor.dtype == source.dtype and tensor.layout == source.layout:
                        tensor.data = source.data  # the new tensor takes the trained storage: no copy, no second allocation
                        report.shared += 1
                    else:
                        tensor.copy_(source)
                    report.carried.append(tensor)
                    report.tensors += 1
                    if isinstance(source, torch.nn.Parameter) and isinstance(tensor, torch.nn.Parameter):
                        report.param_map[id(source)] = tensor
            report.dropped.extend(f"{path}.{name}" for name in old_tensors if name not in found)
        report.dropped.extend(path for path, module in old_modules.items() if id(module) not in matched_old)
        report.old_names = {id(p): f"{path}.{n}" for path, m in old_modules.items() for n, p in m.named_parameters()}
        for path, new_opt in new_optimizers.items():
            old_opt = old_optimizers.get(path)
            if old_opt is None or old_opt is new_opt:
                continue  # the same object (a global setup() did not make again): see carry_optimizers_setup_did_not_make
            if not _state_can_follow(old_opt, _parameters(new_opt), report):
                report.restarted.append(path)
                continue
            for old_param, state in list(old_opt.state.items()):
                new_param = report.param_map.get(id(old_param))
                if new_param is None:
                    continue
                new_opt.state[new_param] = _moved_to(state, new_param)
                report.optimizer_states += 1
    return report


def _copy_sharded(source: torch.Tensor, target: torch.Tensor) -> None:
    """A sharded parameter (DTensor) cannot take the old one's storage: FSDP2 all-gathers from the padded storage it
    allocated for the new one, whatever the DTensor is later pointed at (the new model ran on uninitialized memory
    while the rebuild said its tensors were carried). Same layout on both sides (a rebuild on the same ranks): each
    rank copies its own shard, no collective. Otherwise DTensor's copy redistributes, on every rank alike."""
    old, new = local_shard(source), local_shard(target)
    if (old is not None and new is not None and source.placements == target.placements  # type: ignore[attr-defined]
            and source.device_mesh == target.device_mesh and old.shape == new.shape):  # type: ignore[attr-defined]
        new.copy_(old)
    else:
        target.copy_(source)


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _state_can_follow(old: torch.optim.Optimizer, new_params: list[torch.Tensor], report: CarryReport) -> bool:
    """Whether `old`'s state can be moved parameter by parameter onto an optimizer over `new_params`. Not when a
    state tensor spans more than its parameter (LBFGS keeps its history as flat vectors over all the parameters,
    under the first one) and the parameters are not the same ones, in the same order: carried, the next step
    fails on the vectors' old length (or, worse, runs on stale directions)."""
    spans_all = any(
        isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() > param.numel()  # Adafactor's are smaller
        for param, state in old.state.items() for value in state.values()
    )
    if not spans_all:
        return True
    old_params = _parameters(old)
    return len(old_params) == len(new_params) and all(
        report.param_map.get(id(o)) is n for o, n in zip(old_params, new_params)
    )


def restarted_note(paths: list[str]) -> str:
    shown = ", ".join(paths)
    return (f"optimizer state not carried over: {shown} keeps its state over all its parameters together (flat "
            "vectors, as LBFGS does), and the parameters changed, so it starts over")


def _moved_to(state: dict[str, Any], param: torch.Tensor) -> dict[str, Any]:
    return {k: (v.to(param.device) if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in state.items()}


def carry_optimizers_setup_did_not_make(
    old_state: Any, new_state: Any, report: CarryReport, namespaces: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    """Optimizers that `setup()` does not make still point at the old model's parameters after a rebuild:
    one `step()` makes on first use and keeps in the state (`state["opt_d"] = ...`), or one in a module
    global (`global OPT_D`). Left alone, the first is dropped with its state and the second trains the
    discarded model while the new one never learns. Each is made again over the new parameters the old
    ones were carried to (`report`), with its hyperparameters and state, in the same place. One in a global
    that holds parameters of no model at all (a model an earlier rebuild discarded) is named.
    Returns a sentence per optimizer for the event.
    """
    _, new_optimizers = find_with_globals(new_state, namespaces)
    live_params = {id(p) for m in find_with_globals(new_state, namespaces)[0].values() for p in m.parameters()}
    places: list[tuple[str, torch.optim.Optimizer, Any]] = []  # (where, optimizer, how to put its successor there)
    notes = []
    if isinstance(old_state, dict) and isinstance(new_state, dict):
        for key, value in old_state.items():
            if isinstance(value, torch.optim.Optimizer) and key not in new_state and str(key) not in new_optimizers:
                places.append((f"state[{key!r}]", value, (new_state, key)))
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if not isinstance(value, torch.optim.Optimizer):
                continue
            params = [id(p) for group in value.param_groups for p in group["params"]]
            if params and all(p in live_params for p in params):
                continue  # over the live model already (setup() made it again, or the model stayed the same object)
            if any(p in report.old_names for p in params):
                places.append((f"{module_name}.{key}", value, (namespace, key)))
            elif params and not any(p in live_params for p in params):
                notes.append(
                    f"{module_name}.{key} is an optimizer over parameters of no model in the state (one an earlier "
                    "rebuild left behind?): it trains nothing that runs; make it again (set it to None if step() "
                    "makes it on first use)"
                )
    for where, old_opt, (holder, key) in places:
        made = _made_again(old_opt, report)
        if isinstance(made, str):
            notes.append(f"{where}, an optimizer setup() does not make, was not carried over: {made}")
            continue
        holder[key] = made
        notes.append(
            f"{where}, an optimizer setup() does not make, was made again over the new parameters with its "
            f"hyperparameters and the state of {len(made.state)} parameters"
        )
        notes.extend(_schedulers_follow(old_opt, made, where, old_state, new_state, namespaces))
    return notes


def _schedulers_follow(old_opt: torch.optim.Optimizer, made: torch.optim.Optimizer, where: str, old_state: Any,
                       new_state: Any, namespaces: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The LR schedulers over an optimizer made again here drive the new one: a scheduler `step()` makes with it
    (`state["sched"]`, `global SCHED`) kept stepping the discarded optimizer, the rate training used never moved
    again, and one in the state was dropped while its optimizer was put back (the next step's `state["sched"]`
    raised KeyError). Returns a note per scheduler."""
    found: dict[str, LRScheduler] = {}
    if isinstance(old_state, dict) and isinstance(new_state, dict):
        for key, value in old_state.items():
            if isinstance(value, LRScheduler) and key not in new_state and _drives(value, old_opt):
                new_state[key] = value  # its place in the schedule is its own: the scheduler itself goes on
                found[f"state[{key!r}]"] = value
    for module_name, namespace in namespaces:
        for key, value in namespace.items():
            if isinstance(value, LRScheduler) and _drives(value, old_opt):
                found[f"{module_name}.{key}"] = value
    for scheduler in found.values():
        _point_at(scheduler, old_opt, made)
    return [f"{path} ({type(s).__name__}), an LR scheduler setup() does not make, now steps {where}'s new optimizer "
            "and goes on with its schedule" for path, s in found.items()]


def _drives(scheduler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the scheduler (or one a SequentialLR or ChainedScheduler holds) sets this optimizer's rates."""
    return getattr(scheduler, "optimizer", None) is optimizer or any(
        _drives(inner, optimizer) for inner in getattr(scheduler, "_schedulers", None) or ())


def _point_at(scheduler: Any, old: torch.optim.Optimizer, made: torch.optim.Optimizer) -> None:
    """`scheduler.optimizer` (and a SequentialLR's or ChainedScheduler's inner ones') from `old` to `made`."""
    if getattr(scheduler, "optimizer", None) is old:
        scheduler.optimizer = made
    for inner in getattr(scheduler, "_schedulers", None) or ():
        _point_at(inner, old, made)


def _made_again(old: torch.optim.Optimizer, report: CarryReport) -> torch.optim.Optimizer | str:
    """A new optimizer of the same type over the new parameters, or why it cannot be made."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    groups = []
    for group in old.param_groups:
        params = []
        for p in group["params"]:
            new = report.param_map.get(id(p))
            if new is None:
                return f"its parameter {report.old_names.get(id(p), 'of no module in the state')} has no match in the new state"
            params.append(new)
            pairs.append((p, new))
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    try:
        made = type(old)(groups)
    except Exception as exc:  # noqa: BLE001 - an optimizer whose constructor needs more than its groups
        return f"{type(old).__name__}(param_groups) failed ({type(exc).__name__}: {exc})"
    with torch.no_grad():
        for old_param, new_param in pairs:
            state = old.state.get(old_param)
            if state:
                made.state[new_param] = _moved_to(state, new_param)
    return made


def restore_globals(namespaces: list[tuple[str, dict[str, Any]]], saved: list[tuple[str, dict[str, Any]]]) -> None:
    """Module globals as they were saved (a failed rebuild changes nothing): re-bound ones get their old value,
    new ones go."""
    for (_, namespace), (_, old) in zip(namespaces, saved):
        for key in [k for k in namespace if k not in old]:
            del namespace[key]
        for key, value in old.items():
            if namespace.get(key) is not value:
                namespace[key] = value
