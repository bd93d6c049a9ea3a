"""The global random states (Python's `random`, torch's CPU generator, each GPU's): kept in snapshots, and set around
a rebuild's setup().

A rebuild is a fresh start that keeps the trained state, so its setup() draws what a fresh start's would (a
`random_split` of the data, a new layer's initial weights) from the states the session's first setup() started
from, and training then goes on drawing from where it was (dropout, the next epoch's order), as a resume from a
snapshot at that step would. numpy's global generator is not among them (nor in snapshots).
"""

from __future__ import annotations

import random
from typing import Any

import torch


def capture() -> dict[str, Any]:
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        try:
            states["cuda"] = torch.cuda.get_rng_state_all()
        except Exception:  # noqa: BLE001 - a GPU that cannot report it: go on without it
            pass
    return states


def restore(states: dict[str, Any]) -> None:
    """Set what `capture` took (or a snapshot's copy of it); what cannot be set (from another machine) is left."""
    try:
        if "python" in states:
            version, internal, gauss = states["python"]
            random.setstate((version, tuple(internal), gauss))
        if "torch" in states:
            torch.set_rng_state(states["torch"])
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
    except Exception:  # noqa: BLE001 - a state from another machine: continue without it
        pass
