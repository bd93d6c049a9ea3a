"""Checks that need a real NVIDIA GPU: `python -m pytest -m cuda` on a machine with CUDA.

The default run deselects them (pyproject: -m 'not cuda'); without a GPU they skip.
"""

from __future__ import annotations

import pytest
import torch

from workbench.actions.cleanup import run_cleanup
from workbench.memory.device import TorchNvmlProbe

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_probe_reads_allocator_and_nvml_for_every_visible_gpu():
    probe = TorchNvmlProbe()
    assert probe.available()
    gpus = probe.gpus()
    assert len(gpus) == torch.cuda.device_count()
    before = gpus[0].allocated
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    after = probe.gpus()[0]
    assert after.allocated >= before + block.numel()
    assert after.device_total and after.device_used and after.device_used >= after.reserved
    assert probe.unavailable_reason() is None, probe.unavailable_reason()


def test_cleanup_returns_cached_blocks_to_the_driver():
    probe = TorchNvmlProbe()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    del block  # now cached by torch's allocator, not free on the device
    event = run_cleanup(probe)
    assert event.freed_bytes >= 256 * 2**20
    assert event.after["cuda:0.reserved"] < event.before["cuda:0.reserved"]
