"""Parameters that setup() left holding garbage: non-finite or absurdly large values.

The memory-efficient way to build a big model (`torch.device("meta")`, then `to_empty()` and each module's
`reset_parameters()`; the FSDP2 recipe) leaves uninitialized memory in every parameter the initialization does not
reach. The first step then turns the loss into NaN, and that step is blamed. Said right after setup(), the warning
names the parameters at fault while they are still the only ones at fault.

The check costs one reduction a parameter, not a copy (12 ms for 400 MB of float32 on this 2-core VM): the norm is
non-finite when any element is, and the root mean square comes with it.
Sharded parameters (DTensor) are checked on this rank's shard, with no collective."""

from __future__ import annotations

import math
from typing import Any

import torch

from workbench.engine.memory.shards import held_here
from workbench.engine.state_walk import Namespaces, find_with_globals

WHERE = "parameters"  # in events.WARNINGS: a warning, training goes on (a NaN loss pauses it as ever)
HUGE_RMS = 1e6  # no initialization gives a parameter a root mean square anywhere near this; garbage memory often does
_MAX_NAMES = 8


def suspect_parameters(state: Any, namespaces: Namespaces = ()) -> list[str]:
    """Names of the parameters whose values are non-finite or whose root mean square is above HUGE_RMS."""
    modules, _ = find_with_globals(state, namespaces)
    suspects: list[str] = []
    with torch.no_grad():
        for module_name, module in modules.items():
            suspects.extend(f"{module_name}.{name}" for name, param in module.named_parameters() if holds_garbage(param))
    return suspects


def holds_garbage(param: torch.Tensor) -> bool:
    """Non-finite, or a root mean square above HUGE_RMS: one reduction in the tensor's own dtype (no float32 copy
    of a big half-precision parameter); this rank's shard of a DTensor."""
    tensor = held_here(param).detach()
    if tensor.numel() == 0 or not tensor.is_floating_point() or tensor.device.type == "meta":
        return False
    try:
        if tensor.dtype == torch.float16:  # its norm overflows on honest values; it cannot hold a huge one anyway
            low, high = torch.aminmax(tensor.reshape(-1))
            return not (math.isfinite(float(low)) and math.isfinite(float(high)))
        norm = float(torch.linalg.vector_norm(tensor))
    except (RuntimeError, TypeError):  # a dtype with no reduction (float8): not checked
        return False
    return not math.isfinite(norm) or norm / math.sqrt(tensor.numel()) > HUGE_RMS


def warning_sentence(suspects: list[str]) -> str:
    shown = ", ".join(suspects[:_MAX_NAMES]) + (f" and {len(suspects) - _MAX_NAMES} more" if len(suspects) > _MAX_NAMES else "")
    count = "1 parameter" if len(suspects) == 1 else f"{len(suspects)} parameters"
    return (f"setup() left non-finite or absurdly large values (root mean square over {HUGE_RMS:.0e}) in {count}: {shown}. "
            "That is uninitialized memory, most likely: `to_empty()` and `torch.empty` do not initialize, and a "
            "`reset_parameters()` that does not reach every submodule leaves theirs so. The first step will turn the "
            "loss into NaN. Initialize them in setup(), save and rebuild (`R`): a rebuild never carries such values "
            "over, so those parameters take what the new setup() makes")
