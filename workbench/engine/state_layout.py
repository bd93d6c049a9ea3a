"""Whether two states of one object are laid out alike (keys, lengths, tensor shapes and dtypes), and a saved state
moved onto the devices of a live one: what every put-back of a kept state (a loader's, an EMA's, training's
tensors) checks and does before it hands the state over."""

from __future__ import annotations

from typing import Any

import torch

from workbench.engine.actions.snapshot_integrity import payload_bytes


def layout_change(old: Any, new: Any, where: str = "") -> str | None:
    """Where two states differ in layout (a dict's keys, a list's length, a tensor's shape or dtype), or None. An EMA
    of a model that gained a layer, given the old shadow weights, would fail its next update on the missing key."""
    if new is None:
        return None  # not made yet (an EMA that makes its shadows at its first update): the saved one fits
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return f"{where or 'it'} is a tensor in one and not the other"
        if old.shape != new.shape or old.dtype != new.dtype:
            return f"{where or 'it'} is {tuple(old.shape)} {old.dtype} then {tuple(new.shape)} {new.dtype}"
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            added, gone = sorted(map(str, new.keys() - old.keys())), sorted(map(str, old.keys() - new.keys()))
            shown = "; ".join(f"{label} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                              for label, keys in (("new", added), ("gone", gone)) if keys)
            return f"{where + ' has' if where else 'it has'} other keys ({shown})"
        return next((d for key in old if (d := layout_change(old[key], new[key], f"{where}[{key!r}]"))), None)
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        if len(old) != len(new):
            return f"{where or 'it'} has {len(old)} items then {len(new)}"
        return next((d for i, (a, b) in enumerate(zip(old, new)) if (d := layout_change(a, b, f"{where}[{i}]"))), None)
    containers = (dict, list, tuple)
    if isinstance(old, containers) != isinstance(new, containers) and payload_bytes(old) + payload_bytes(new) > 0:
        return f"{where or 'it'} is a {type(old).__name__} then a {type(new).__name__}"
    return None


def on_devices_of(saved: Any, live: Any) -> Any:
    """`saved`, each tensor moved to the device of the tensor at the same place in `live` (a dict's key, a list's
    index) where that is another; the rest as it is."""
    if isinstance(saved, torch.Tensor):
        return saved.to(live.device) if isinstance(live, torch.Tensor) and live.device != saved.device else saved
    if isinstance(saved, dict) and isinstance(live, dict):
        return {key: on_devices_of(value, live[key]) if key in live else value for key, value in saved.items()}
    if type(saved) in (list, tuple) and isinstance(live, (list, tuple)):
        return type(saved)(on_devices_of(value, live[i]) if i < len(live) else value for i, value in enumerate(saved))
    return saved
