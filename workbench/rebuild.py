"""Rebuild: run setup() again with new code and carry the trained state over.

Parameters and buffers move by module path and tensor name when the shapes
match; optimizer state follows its parameters. What did not match is reported,
never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.state_walk import Namespaces, find_with_globals


@dataclass
class CarryReport:
    tensors: int = 0
    optimizer_states: int = 0
    new: list[str] = field(default_factory=list)  # in the new state only: freshly initialised
    mismatched: list[str] = field(default_factory=list)  # same name, other shape: freshly initialised
    dropped: list[str] = field(default_factory=list)  # in the old state only: gone
    unmatched_modules: list[str] = field(default_factory=list)


def carry_over(old_state: Any, new_state: Any, old_namespaces: Namespaces = (), new_namespaces: Namespaces = ()) -> CarryReport:
    """`old_namespaces`: the project's module globals as they were before setup() ran again (copies: setup()
    re-binds `global model`), `new_namespaces` as they are now; a model only a global holds is carried too."""
    report = CarryReport()
    old_modules, old_optimizers = find_with_globals(old_state, old_namespaces)
    new_modules, new_optimizers = find_with_globals(new_state, new_namespaces)
    old_params_by_name: dict[str, torch.Tensor] = {}
    new_params_by_name: dict[str, torch.Tensor] = {}
    carried_names: set[str] = set()
    with torch.no_grad():
        for path, new_module in new_modules.items():
            old_module = old_modules.get(path)
            if old_module is None:
                report.unmatched_modules.append(path)
                continue
            old_tensors = old_module.state_dict(keep_vars=True)
            new_tensors = new_module.state_dict(keep_vars=True)
            for name, tensor in new_tensors.items():
                full = f"{path}.{name}"
                source = old_tensors.get(name)
                if source is None:
                    report.new.append(full)
                elif source.shape != tensor.shape:
                    report.mismatched.append(f"{full} {tuple(source.shape)} -> {tuple(tensor.shape)}")
                else:
                    tensor.copy_(source)
                    report.tensors += 1
                    carried_names.add(full)
            report.dropped.extend(f"{path}.{name}" for name in old_tensors if name not in new_tensors)
            old_params_by_name.update({f"{path}.{n}": p for n, p in old_module.named_parameters()})
            new_params_by_name.update({f"{path}.{n}": p for n, p in new_module.named_parameters()})
        report.dropped.extend(path for path in old_modules if path not in new_modules)
        name_of_old = {id(p): name for name, p in old_params_by_name.items()}
        for path, new_opt in new_optimizers.items():
            old_opt = old_optimizers.get(path)
            if old_opt is None or old_opt is new_opt:
                continue  # the same object (a global setup() did not make again): see carry_optimizers_setup_did_not_make
            for old_param, state in list(old_opt.state.items()):
                name = name_of_old.get(id(old_param))
                new_param = new_params_by_name.get(name) if name in carried_names else None
                if new_param is None:
                    continue
                new_opt.state[new_param] = {
                    k: (v.to(new_param.device) if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in state.items()
                }
                report.optimizer_states += 1
    return report


def carry_optimizers_setup_did_not_make(
    old_state: Any, new_state: Any, old_namespaces: Namespaces, namespaces: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    """Optimizers that `setup()` does not make still point at the old model's parameters after a rebuild:
    one `step()` makes on first use and keeps in the state (`state["opt_d"] = ...`), or one in a module
    global (`global OPT_D`). Left alone, the first is dropped with its state and the second trains the
    discarded model while the new one never learns. Each is made again over the matching new parameters,
    with its hyperparameters and state, in the same place. Returns a sentence per optimizer for the event.
    """
    old_modules, _ = find_with_globals(old_state, old_namespaces)
    new_modules, new_optimizers = find_with_globals(new_state, namespaces)
    name_of_old = {id(p): f"{path}.{n}" for path, m in old_modules.items() for n, p in m.named_parameters()}
    new_by_name = {f"{path}.{n}": p for path, m in new_modules.items() for n, p in m.named_parameters()}
    places: list[tuple[str, torch.optim.Optimizer, Any]] = []  # (where, optimizer, how to put its successor there)
    if isinstance(old_state, dict) and isinstance(new_state, dict):
        for key, value in old_state.items():
            if isinstance(value, torch.optim.Optimizer) and key not in new_state and str(key) not in new_optimizers:
                places.append((f"state[{key!r}]", value, (new_state, key)))
    for module_name, namespace in namespaces:
        for key, value in list(namespace.items()):
            if isinstance(value, torch.optim.Optimizer) and _points_at(value, name_of_old):
                places.append((f"{module_name}.{key}", value, (namespace, key)))
    notes = []
    for where, old_opt, (holder, key) in places:
        made = _made_again(old_opt, name_of_old, new_by_name)
        if isinstance(made, str):
            notes.append(f"{where}, an optimizer setup() does not make, was not carried over: {made}")
            continue
        holder[key] = made
        notes.append(
            f"{where}, an optimizer setup() does not make, was made again over the new parameters with its "
            f"hyperparameters and the state of {len(made.state)} parameters"
        )
    return notes


def _points_at(optimizer: torch.optim.Optimizer, params_by_id: dict[int, str]) -> bool:
    return any(id(p) in params_by_id for group in optimizer.param_groups for p in group["params"])


def _made_again(
    old: torch.optim.Optimizer, name_of_old: dict[int, str], new_by_name: dict[str, torch.nn.Parameter]
) -> torch.optim.Optimizer | str:
    """A new optimizer of the same type over the new parameters, or why it cannot be made."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    groups = []
    for group in old.param_groups:
        params = []
        for p in group["params"]:
            new = new_by_name.get(name_of_old.get(id(p), ""))
            if new is None or new.shape != p.shape:
                return f"its parameter {name_of_old.get(id(p), 'of no module in the state')} has no match in the new state"
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
                made.state[new_param] = {
                    k: (v.to(new_param.device) if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in state.items()
                }
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
