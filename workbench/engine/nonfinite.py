"""Name the parameters behind a NaN/Inf loss, so the user knows where to look."""

from __future__ import annotations

from typing import Any

import torch

from workbench.engine.state_walk import find_modules_and_optimizers

_MAX_NAMES = 8


def describe_non_finite(state: Any) -> str:
    """Which parameters have non-finite gradients or values (gradients may already be cleared)."""
    modules, _ = find_modules_and_optimizers(state)
    bad_grads: list[str] = []
    bad_values: list[str] = []
    with torch.no_grad():
        for module_name, module in modules.items():
            for name, param in module.named_parameters():
                full = f"{module_name}.{name}"
                if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
                    bad_grads.append(full)
                if not bool(torch.isfinite(param).all()):
                    bad_values.append(full)
    parts = []
    if bad_grads:
        parts.append(f"non-finite gradients in {_names(bad_grads)}")
    if bad_values:
        parts.append(f"non-finite values in {_names(bad_values)}")
    if not parts:
        return "no parameter or gradient is non-finite (gradients may have been cleared by zero_grad)"
    return "; ".join(parts)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")
