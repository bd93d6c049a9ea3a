"""Count the bytes autograd saves for backward during a step: activation memory, measured on any device.

Parameters (and views of them) are not counted: they live for the whole session
anyway. Each storage counts once. Hooks the step installs itself (checkpointing,
`save_on_cpu`) take precedence inside their scope, so what they keep out of
autograd's saved set is, rightly, not counted.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.engine.state_walk import find_modules_and_optimizers


class SavedBytes:
    def __init__(self, state: Any) -> None:
        modules, _ = find_modules_and_optimizers(state)
        self._params = {key for m in modules.values() for p in m.parameters() if (key := _param_key(p)) is not None}
        self._seen: set[tuple[int, str]] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            key = _key(tensor)
            if key not in self._seen and key not in self._params:
                self._seen.add(key)
                self.bytes += tensor.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 - tensors without a plain storage are not counted
            pass
        # Detached: a node that saves its own output (relu, tanh, log_softmax) would otherwise hold that
        # output, whose grad_fn holds the node: a cycle inside autograd that gc cannot see, so a graph dropped
        # without backward during a measured step would never be freed. Same storage, same version counter.
        return tensor.detach()

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def _key(tensor: torch.Tensor) -> tuple[int, str]:
    return tensor.untyped_storage().data_ptr(), str(tensor.device)


def _param_key(param: torch.Tensor) -> tuple[int, str] | None:
    """A parameter's storage key; a DTensor's (FSDP2) is its local shard's; None for one without a plain storage."""
    local = getattr(param, "to_local", None)
    try:
        return _key(local() if callable(local) else param)
    except RuntimeError:
        return None


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
