"""Tensors training keeps beside the model: an LSTM's hidden state carried from batch to batch, kept in snapshots.

pytorch/examples' word_language_model carries `hidden` across batches (`hidden = repackage_hidden(hidden)`); ported
to setup()/step(), it lives in setup()'s state (`state["hidden"] = hidden`) or a module global. A snapshot held the
models, the optimizers and plain values, not such a tensor: a resume began it at setup()'s zeros, and the resumed
run computed other losses than the run that never stopped, without a word.

So a value of setup()'s dict or a module global that is a tensor, or a tuple, list or dict of tensors, and that
training has changed since setup() made it (bound to another object, or a tensor of it changed in place: its version
counter moved) is training state, unless it is a model's parameter or buffer, which the models carry. Each rank keeps
its own in its record (its hidden state is its own batch's); a resume puts it back where setup()'s value has the same
layout, on that value's devices, and a rebuild gives it to the state its new setup() makes. Over `MAX_KEPT_BYTES` in
all it is not kept, and the snapshot says so.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from workbench.engine.actions.snapshot_integrity import payload_bytes
from workbench.engine.state_layout import layout_change, on_devices_of
from workbench.engine.training_globals import Namespaces, put_back_each, shown, split_qualified, state_namespace

MAX_KEPT_BYTES = 16 << 20  # per rank: a hidden state is small; a value this big is data, not a place in it


def _leaves(value: Any, depth: int = 0) -> list[torch.Tensor] | None:
    """The tensors of a value made of tensors only (a tuple of them, a dict of them by str or int keys: one per
    layer; None left aside), else None. A tensor made under inference_mode has no version counter to tell a change
    by: not a candidate."""
    if isinstance(value, torch.Tensor):
        return None if isinstance(value, torch.nn.Parameter) or value.is_inference() else [value]
    if depth >= 3:
        return None
    if type(value) in (tuple, list):
        items = list(value)
    elif type(value) is dict and all(type(key) in (str, int) for key in value):
        items = list(value.values())
    else:
        return None
    found: list[torch.Tensor] = []
    for item in items:
        if item is None:
            continue
        inner = _leaves(item, depth + 1)
        if inner is None:
            return None
        found.extend(inner)
    return found or None


def _candidates(namespaces: Namespaces) -> list[tuple[str, Any, list[torch.Tensor]]]:
    found = []
    for module, namespace in namespaces:
        for name, value in list(namespace.items()):
            if isinstance(name, str) and not name.startswith("__") and (leaves := _leaves(value)) is not None:
                found.append((f"{module}.{name}", value, leaves))
    return found


class _AsMade:
    """A candidate as setup() left it: a weak reference to each of its tensors and its version. Not ids: once
    training rebinds the value, setup()'s tensor is freed and a new one (version 0) is often given its address, so
    a changed hidden state looked unchanged and was left out of the snapshot."""

    def __init__(self, leaves: list[torch.Tensor]) -> None:
        self._leaves = [(weakref.ref(leaf), leaf._version) for leaf in leaves]

    def same(self, leaves: list[torch.Tensor]) -> bool:
        return len(leaves) == len(self._leaves) and all(
            ref() is leaf and leaf._version == version for (ref, version), leaf in zip(self._leaves, leaves))


def _storage(tensor: torch.Tensor) -> int:
    """Where the tensor's memory is (0: nowhere this can tell, a meta tensor or a subclass)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if type(value) in (tuple, list):
        return type(value)(_detached(item) for item in value)
    if type(value) is dict:
        return {key: _detached(item) for key, item in value.items()}
    return value


class TrainingTensors:
    """Each candidate as setup() left it (which object, each tensor's version); what differs later is training's."""

    def __init__(self) -> None:
        self._after_setup: dict[str, _AsMade] = {}

    def mark(self, namespaces: Namespaces) -> None:
        """After setup(). Never a reason for setup() to fail: a value that cannot be looked at is not marked (then a
        snapshot keeps it, if it can)."""
        marks: dict[str, _AsMade] = {}
        try:
            for qualified, _, leaves in _candidates(namespaces):
                marks[qualified] = _AsMade(leaves)
        except Exception:  # noqa: BLE001 - a tensor subclass without weak references or versions
            pass
        self._after_setup = marks

    def changed(self, namespaces: Namespaces, models: list[torch.nn.Module]) -> tuple[dict[str, Any], dict[str, str]]:
        """({qualified: the value, detached} to keep, {shown name: why not kept}). `models`: whose parameters and
        buffers are theirs to carry, never kept here (a buffer bound in the state too would be cut from its model)."""
        theirs = {_storage(t) for model in models for t in (*model.parameters(), *model.buffers())} - {0}
        kept: dict[str, Any] = {}
        refused: dict[str, str] = {}
        total = 0
        for qualified, value, leaves in _candidates(namespaces):
            as_made = self._after_setup.get(qualified)
            # A model's tensor, or a view or detach() of one (sharing its storage), is the model's to carry: a copy
            # put back in its place would no longer follow the weights.
            if (as_made is not None and as_made.same(leaves)) or any(_storage(leaf) in theirs for leaf in leaves):
                continue
            size = payload_bytes(value)
            if total + size > MAX_KEPT_BYTES:
                refused[shown(qualified)] = (f"{size / 2**20:.1f} MiB of tensors training changed, more than the "
                                             f"{MAX_KEPT_BYTES >> 20} MiB a snapshot keeps of them per rank")
                continue
            total += size
            kept[qualified] = _detached(value)
        return kept, refused


def put_back(saved: dict[str, Any], namespaces: Namespaces) -> tuple[list[str], list[str]]:
    """Resume: each saved value where setup()'s has the same layout (or none was made: None or unbound), on the
    devices of setup()'s. Returns (names put back, a reason for each one left)."""
    def give(namespace: dict[str, Any], name: str, value: Any) -> str | None:
        now = namespace.get(name)
        if now is not None and (differs := layout_change(value, now)) is not None:
            return f"setup() makes it otherwise now: {differs}"
        namespace[name] = on_devices_of(value, now) if now is not None else value
        return None

    given, left = put_back_each(saved, namespaces, give)
    return [shown(qualified) for qualified in given], left


def carry(before: TrainingTensors, old_state: Any, new_state: Any, models: list[torch.nn.Module]) -> list[str]:
    """A rebuild: each tensor value of the old state that training changed, into the new state where its setup()
    made one of the same layout (on the new one's devices). The rebuild's notes. Module globals stay as they are."""

    if not (isinstance(old_state, dict) and isinstance(new_state, dict)):
        return []
    kept, _ = before.changed(state_namespace(old_state), models)
    carried, left = [], []
    for qualified, value in kept.items():
        key = split_qualified(qualified)[1]
        if key not in new_state:
            continue
        now = new_state[key]
        if now is not None and (differs := layout_change(value, now)) is not None:
            left.append(f"{shown(qualified)} ({differs})")
            continue
        new_state[key] = on_devices_of(value, now) if now is not None else value
        carried.append(shown(qualified))
    notes = [f"carried over (tensors of the state that training changed): {', '.join(carried)}"] if carried else []
    if left:
        notes.append(f"as the new setup() made them, not carried (their layout changed): {', '.join(left)}")
    return notes
