"""Every thread that runs the project's code has the session's GPU as its current CUDA device.

CUDA's current device belongs to a host thread, and a new Python thread starts on device 0
whatever the thread that started it chose: `torch.cuda.set_device(local_rank)` on a rank's main
thread does not carry over to the training thread. Without this, rank 1's `x.cuda()`,
`torch.zeros(..., device="cuda")`, `torch.cuda.synchronize()` and `torch.cuda.memory_allocated()`
all meant GPU 0 on a multi-GPU node (and so did `--device cuda:1` in a single process). The
training thread, the reload thread and the thread that plans ahead on ranks > 0 (planning runs a
saved file's new imports and constants) call this first.
"""

from __future__ import annotations

import torch


def use_on_this_thread(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (nothing for a CPU session, or `cuda` without an index:
    the thread keeps CUDA's own choice)."""
    if device.type != "cuda" or device.index is None:
        return
    torch.cuda.set_device(device)
