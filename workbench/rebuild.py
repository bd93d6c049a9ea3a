"""Rebuild: run setup() again with new code and carry the trained state over.

Parameters and buffers move by module path and tensor name when the shapes
match; optimizer state follows its parameters. What did not match is reported,
never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.state_walk import find_modules_and_optimizers


@dataclass
class CarryReport:
    tensors: int = 0
    optimizer_states: int = 0
    new: list[str] = field(default_factory=list)  # in the new state only: freshly initialised
    mismatched: list[str] = field(default_factory=list)  # same name, other shape: freshly initialised
    dropped: list[str] = field(default_factory=list)  # in the old state only: gone
    unmatched_modules: list[str] = field(default_factory=list)


def carry_over(old_state: Any, new_state: Any) -> CarryReport:
    report = CarryReport()
    old_modules, old_optimizers = find_modules_and_optimizers(old_state)
    new_modules, new_optimizers = find_modules_and_optimizers(new_state)
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
            if old_opt is None:
                continue
            for old_param, state in old_opt.state.items():
                name = name_of_old.get(id(old_param))
                new_param = new_params_by_name.get(name) if name in carried_names else None
                if new_param is None:
                    continue
                new_opt.state[new_param] = {
                    k: (v.to(new_param.device) if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in state.items()
                }
                report.optimizer_states += 1
    return report
