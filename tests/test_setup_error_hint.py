"""setup() errors that vram-bench's own set-up causes say what to do (workbench/engine/distributed.py).

Found porting pytorch/examples' FSDP2 trainer: its main() calls init_process_group, which vram-bench has already
made under torchrun, and the user read only torch's "trying to initialize the default process group twice!"."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from workbench.engine.distributed import setup_error_hint


def test_a_second_init_process_group_in_setup_is_told_why_and_what_to_do():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # as vram-bench makes it
    try:
        with pytest.raises(Exception) as raised:  # torch's own error, in torch's own words
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    finally:
        dist.destroy_process_group()
    hint = setup_error_hint(raised.value)
    assert "made the default process group before setup() ran" in hint
    assert "if not torch.distributed.is_initialized()" in hint


def test_other_errors_get_no_hint():
    assert setup_error_hint(ValueError("shapes do not match")) == ""
    assert setup_error_hint(KeyError("initialize the default process group twice")) == ""
