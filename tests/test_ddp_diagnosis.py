"""The sentence for DDP's unused-parameter error names the parameters, in the grammar of their number.

A real DistributedDataParallel on a one-rank gloo group in this process (made and destroyed here)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from workbench.engine.ddp_diagnosis import UNUSED_MARKER, unused_parameter_sentence


def test_the_sentence_names_the_unused_parameters_from_ddps_indices() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)))
        state = {"model": model}
        one = unused_parameter_sentence(f"{UNUSED_MARKER} ... Parameter indices which did not receive grad for rank 0: 2", state, [])
        two = unused_parameter_sentence(f"{UNUSED_MARKER} ... Parameter indices which did not receive grad for rank 0: 2 3", state, [])
    finally:
        dist.destroy_process_group()
    assert "no longer uses 1.weight in the loss, so its gradient was never reduced" in one, one
    assert "no longer uses 1.weight, 1.bias in the loss, so their gradients were never reduced" in two, two
