"""A resume goes on with the hyperparameters the snapshot's optimizers had: the ones the code now gives are named.

`load_state_dict()` gives an optimizer the snapshot's param groups, hyperparameters included. That is what a resumed
run needs (the schedule's place, an LR a step() set), but after an edit it is not what the file says: a Lion port's
resume after `LR = 3e-3` -> `1e-3` and its default betas (0.9, 0.99) -> (0.5, 0.9) trained on with lr 0.003 and
beta1 0.9 while the `resume` event said nothing, where `R` in the same state applies the file's values. So the values
setup() made are read before the load, and each that differs from the snapshot's is named with what applies the
code's. A hyperparameter the project's code sets itself (`group['lr'] = lr` in step()) is left out: the code's value
reaches the optimizer at the next step; under an LR scheduler the learning rate is the schedule's, so its base
(`initial_lr`) is what is compared.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from workbench.engine.hotswap.sets_in_code import where_code_sets

Settings = dict[str, list[dict[str, Any]]]  # optimizer path -> each group's hyperparameters

_NOT_SETTINGS = frozenset({"params", "param_names"})
_UNREADABLE = object()  # a value not compared (an object of a library's, a tensor of several elements)


def settings_of(optimizers: dict[str, torch.optim.Optimizer]) -> Settings:
    """Each optimizer's hyperparameters as they are now (before a resume loads the snapshot's)."""
    return {name: [{key: _plain(value) for key, value in group.items() if key not in _NOT_SETTINGS}
                   for group in optimizer.param_groups]
            for name, optimizer in optimizers.items()}


def kept_from_snapshot(made: Settings, optimizers: dict[str, torch.optim.Optimizer], step: int,
                       namespaces: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The resume's notes: for each loaded optimizer whose hyperparameters differ from those setup() made, which."""
    notes = []
    for name, optimizer in optimizers.items():
        groups = made.get(name)
        if groups is None or len(groups) != len(optimizer.param_groups):
            continue
        differing = []
        for index, (before, group) in enumerate(zip(groups, optimizer.param_groups)):
            for key, value in before.items():
                if key == "lr" and "initial_lr" in before:
                    continue  # an LR scheduler's: it sets the rate from its base, compared as `initial_lr`
                if key in ("betas", "momentum") and "max_momentum" in before:
                    continue  # OneCycleLR and CyclicLR cycle the momentum between their own bounds
                now = _plain(group.get(key))
                if value is _UNREADABLE or now is _UNREADABLE or _same(now, value):
                    continue
                if where_code_sets(namespaces, "lr" if key == "initial_lr" else key) is not None:
                    continue  # the project's code sets it itself: its value reaches the optimizer
                where = f" (group {index})" if len(groups) > 1 else ""
                differing.append(f"{key}{where} {now!r}, where setup() made {value!r}")
        if differing:
            notes.append(
                f"{name} goes on with the hyperparameters the snapshot's run had at step {step}, not those setup() "
                f"made from the code now: {'; '.join(differing)}. To train with the code's, set them in step() "
                f"(`for group in {name.rsplit('.', 1)[-1]}.param_groups: group['lr'] = LR`) or press R (command "
                "`rebuild`), which makes the optimizer from the code and carries its trained state over"
            )
    return notes


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else _UNREADABLE
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = tuple(_plain(item) for item in value)
        return _UNREADABLE if any(item is _UNREADABLE for item in items) else items
    return _UNREADABLE


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
