"""A resume goes on with the hyperparameters the snapshot's optimizers had: the ones the code now gives are named.

`load_state_dict()` gives an optimizer the snapshot's param groups, hyperparameters included. That is what a resumed
run needs (the schedule's place, an LR a step() set), but after an edit it is not what the file says: a Lion port's
resume after `LR = 3e-3` -> `1e-3` and its default betas (0.9, 0.99) -> (0.5, 0.9) trained on with lr 0.003 and
beta1 0.9 while the `resume` event said nothing, where `R` in the same state applies the file's values. So the values
setup() made are read before the load and compared with those the snapshot's run was made with, which the snapshot
keeps (`optimizers_as_made`): compared as made, never with the snapshot's current values, which a schedule moves
(torch's, a library's such as timm's, the project's own warm-up). Each that differs is named with what applies the
code's. A hyperparameter the project's code sets itself (`group['lr'] = lr` in step()) is left out: the code's value
reaches the optimizer at the next step.
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


def kept_from_snapshot(made_now: Settings, made_then: Settings | None, optimizers: dict[str, torch.optim.Optimizer],
                       step: int, namespaces: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The resume's notes: for each loaded optimizer, the hyperparameters setup() makes now (`made_now`, read before
    the load) unlike those the snapshot's run was made with (`made_then`, kept in the snapshot: none in one written
    before 2026-12-01). Made against made, a schedule's moves (an LR scheduler, a library's, the project's own warm-up)
    are never taken for an edit."""
    notes = []
    for name, optimizer in optimizers.items():
        now_groups, then_groups = made_now.get(name), (made_then or {}).get(name)
        if now_groups is None or then_groups is None or len(now_groups) != len(then_groups):
            continue
        differing = []
        for index, (now, then) in enumerate(zip(now_groups, then_groups)):
            for key, value in now.items():
                before = _plain(then.get(key, _UNREADABLE))
                if value is _UNREADABLE or before is _UNREADABLE or _same(value, before):
                    continue
                if where_code_sets(namespaces, key) is not None:
                    continue  # the project's code sets it itself (`group['lr'] = lr` in step()): its value goes on
                where = f" (group {index})" if len(now_groups) > 1 else ""
                live = _plain(optimizer.param_groups[index].get(key)) if index < len(optimizer.param_groups) else None
                differing.append(f"{key}{where}: setup() makes {value!r} now, the snapshot's run was made with "
                                 f"{before!r}" + (f" and goes on with {live!r}" if live is not _UNREADABLE else ""))
        if differing:
            notes.append(
                f"{name} goes on with the hyperparameters the snapshot's run had at step {step}, not those the code "
                f"gives now: {'; '.join(differing)}. To train with the code's, set them in step() "
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
