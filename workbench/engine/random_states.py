"""The global random states (Python's `random`, torch's CPU generator, each GPU's): kept in snapshots, and set around
a rebuild's setup().

A rebuild is a fresh start that keeps the trained state, so its setup() and the initialization of what it makes new
draw from the states the session's first setup() started from (a `random_split` of the data is a fresh start's,
made before the model or after it: the initialization skipped while setup() runs is made before any draw after it,
init_skipping.py), and training then goes on drawing from where it was (dropout, the next epoch's order), as a resume
from a snapshot at that step would. numpy's global generator is not among them (nor in snapshots).
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


def held(states: dict[str, Any]) -> dict[str, Any]:
    """`capture`'s states with each tensor as bytes, for a copy the session holds for long: the leak finder (t) counted
    a tensor of vram-bench's own as one nobody owns."""
    def plain(value: Any) -> Any:
        return bytes(value.numpy()) if isinstance(value, torch.Tensor) else value

    return {key: [plain(v) for v in value] if key == "cuda" else plain(value) for key, value in states.items()}


def _tensor(value: Any) -> Any:
    return torch.frombuffer(bytearray(value), dtype=torch.uint8) if isinstance(value, bytes) else value


def restore(states: dict[str, Any]) -> None:
    """Set what `capture` took (or a snapshot's copy of it, or `held`'s); what cannot be set (from another machine)
    is left."""
    states = {key: [_tensor(v) for v in value] if key == "cuda" else _tensor(value) if key == "torch" else value
              for key, value in states.items()}
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


RECORD_KEY = "random_states"  # in each rank's record of a snapshot under torchrun (loader_places.py's records)


def put_back_ranks(saved_places: dict[str, Any] | None, rank: int, world_size: int, step: int) -> str | None:
    """Under torchrun: this rank's own states from the snapshot's record of it (a trainer that seeds each rank
    apart, nanoGPT's `1337 + rank`, drew rank 0's dropout on every rank after a resume); on another number of ranks,
    or where the snapshot kept only rank 0's record, rank 0's. The resume's note, or None with nothing to say."""
    ranks = (saved_places or {}).get("ranks") or {}
    same_ranks = (saved_places or {}).get("world_size") == world_size
    own = (ranks.get(rank) or {}).get(RECORD_KEY) if same_ranks else None
    if own is not None:
        restore(own)
        return f"the global random states (Python's, torch's, the GPUs') each rank's own at step {step}, put back"
    first = (ranks.get(0) or {}).get(RECORD_KEY)
    if first is None:
        return None  # a snapshot from before they were kept: a one-file snapshot's own (rank 0's) were put back
    restore(first)
    why = (f"the snapshot is of {saved_places.get('world_size')} ranks, this run has {world_size}"  # type: ignore[union-attr]
           if not same_ranks else "the snapshot keeps no other rank's (rank 0 took it alone)")
    return f"the global random states are rank 0's at step {step} on every rank ({why})"
