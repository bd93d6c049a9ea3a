"""While training is paused the memory sampler slows down, so an idle session leaves the CPU alone."""

from __future__ import annotations

import time

from tests.fakes import FakeDevice, frozen_host
from workbench.engine.memory.sampler import MemorySampler


def count_samples(idle: bool, seconds: float = 0.6) -> int:
    stored = []
    sampler = MemorySampler(
        FakeDevice(), stored.append, lambda event: None, interval=0.01, event_interval=0,
        read_host=frozen_host, idle=lambda: idle, idle_interval=0.25,
    )
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    sampler.join(2)
    return len(stored)


def test_the_sampler_slows_down_while_idle_and_keeps_its_rate_otherwise():
    busy, idle = count_samples(idle=False), count_samples(idle=True)
    assert idle <= 4, f"{idle} samples in 0.6 s at a 0.25 s idle interval"
    assert busy >= 4 * idle, f"busy {busy} vs idle {idle}"
