"""Warn when steps run with a trained model left in eval mode (dropout off, BatchNorm statistics frozen).

The usual cause is an `evaluate()` that calls `model.eval()` and never `model.train()`:
training goes on without an error, only worse. The check is a few attribute reads
per step: the modules to watch are found once (after setup and after a rebuild),
and each warns once until it is seen training again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from workbench.protocol.events import Error
from workbench.engine.state_walk import find_modules_and_optimizers

WHERE = "eval mode"  # in events.WARNINGS: training is not paused


class EvalModeWatch:
    """The top-level modules the user trains, and which of them were already warned about."""

    def __init__(self) -> None:
        # Weak references: a rebuild must be able to free the old model even before the next refresh.
        self._watched: list[tuple[str, weakref.ref[torch.nn.Module]]] = []
        self._warned: set[str] = set()
        self._probes: dict[str, RemovableHandle] = {}  # on the modules that started a step in eval mode
        self._trained_in_step: set[str] = set()  # those whose forward ran in training mode during this step

    def refresh(self, state: Any) -> None:
        """Find the modules to watch in a new state (after setup or a rebuild)."""
        try:
            found = trained_modules(state)
        except Exception:  # noqa: BLE001 - a state we cannot walk only means no warning, never a failed setup
            found = []
        for handle in self._probes.values():
            handle.remove()
        self._probes.clear()
        self._watched = [(label, weakref.ref(module)) for label, module in found]
        self._warned.clear()

    def starting(self) -> frozenset[str]:
        """As a step starts: the watched modules in eval mode (`in_eval`), each probed while it stays so for a forward
        run in training mode during the step. pytorch/examples' GCN loop calls `model.train()` first and evaluates
        last, so every step starts and ends in eval mode and trains in between: it was warned about, falsely. The
        usual step starts in training mode and costs nothing more."""
        started = self.in_eval()
        self._trained_in_step.clear()
        for label in [label for label in self._probes if label not in started]:
            self._probes.pop(label).remove()
        for label, ref in self._watched:
            if label in started and label not in self._probes and (module := ref()) is not None:
                self._probes[label] = module.register_forward_pre_hook(_probe(label, self._trained_in_step))
        return started

    def in_eval(self) -> frozenset[str]:
        """Labels of watched modules not in training mode now (called as a step starts, and after it)."""
        if not self._watched:
            return frozenset()
        return frozenset(label for label, ref in self._watched if (module := ref()) is not None and not module.training)

    def after_step(self, started_in_eval: frozenset[str], step: int) -> Error | None:
        """A warning for modules that started and ended the step in eval mode, once per relapse."""
        if not started_in_eval:  # the usual step: every module trained at its start (no second look: it runs every step)
            self._warned.clear()
            return None
        ran_in_eval = (started_in_eval & self.in_eval()) - self._trained_in_step
        self._warned &= ran_in_eval  # seen training at either end: a relapse warns again
        new = sorted(ran_in_eval - self._warned)
        if not new:
            return None
        self._warned.update(new)
        names = " and ".join(new)
        fix = " and ".join(f"{label}.train()" for label in new)
        return Error(
            where=WHERE,
            message=f"step {step} ran with {names} in eval mode (.training is False): dropout is off and BatchNorm "
            f"uses its running statistics instead of updating them. If evaluate() left it in eval mode, call "
            f"{fix} at the end of evaluate, or at the start of step. Training goes on.",
        )


def _probe(label: str, trained: set[str]) -> Callable[[torch.nn.Module, Any], None]:
    """A forward pre-hook noting that the module ran in training mode (it holds no reference to the module)."""

    def hook(module: torch.nn.Module, args: Any) -> None:
        if module.training:
            trained.add(label)

    return hook


def trained_modules(state: Any) -> list[tuple[str, torch.nn.Module]]:
    """The top-level modules in the state whose parameters an optimizer updates.

    Without an optimizer in the state (a hand-written update), any module with parameters
    that require grad. A frozen teacher or an EMA copy kept in eval mode on purpose is
    not trained by an optimizer, so it is not watched.
    """
    modules, optimizers = find_modules_and_optimizers(state)
    optimized = {id(p) for opt in optimizers.values() for group in opt.param_groups for p in group["params"]}
    chosen = []
    for path, module in modules.items():
        params = list(module.parameters())
        trained = any(id(p) in optimized for p in params) if optimizers else any(p.requires_grad for p in params)
        if trained:
            chosen.append(("state" if module is state else _label(state, path), module))
    return chosen


def _label(state: Any, path: str) -> str:
    """How the user wrote it: `state["model"]` for a key of the dict setup returned."""
    if isinstance(state, dict) and path in state:
        return f'state["{path}"]'
    if path.startswith("["):
        return f"state{path}"
    return f"state.{path}"
