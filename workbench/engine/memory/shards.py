"""A sharded tensor's memory is its shard on this rank.

A DTensor (FSDP2's parameters, their gradients and optimizer state; tensor parallel) is a wrapper whose
`numel()` and `untyped_storage()` describe the whole tensor across ranks; what this process holds is its local
tensor. Counting the wrapper overstated every FSDP2 rank's memory by the number of ranks."""

from __future__ import annotations

import torch


def local_shard(tensor: torch.Tensor) -> torch.Tensor | None:
    """This rank's local tensor of a DTensor; None for any other tensor."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) and hasattr(tensor, "placements") else None


def held_here(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory this process holds: a DTensor's local shard, any other tensor itself."""
    local = local_shard(tensor)
    return tensor if local is None else local
