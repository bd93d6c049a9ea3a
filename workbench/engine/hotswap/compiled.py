"""Drop torch.compile's caches after a code change, so no stale compiled graph runs the old code."""

from __future__ import annotations

import sys


def reset_compiled_code() -> bool:
    """Reset TorchDynamo if anything was ever compiled in this process; True if it was reset."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    try:
        from torch._dynamo.utils import counters

        if not counters["stats"]["unique_graphs"]:
            return False
        dynamo.reset()
    except Exception:  # noqa: BLE001 - a torch without these internals: nothing was compiled by us to reset
        return False
    return True
