"""The memory guard: one warning per climb, the act handed to the training thread in time, per GPU too."""

from __future__ import annotations

from workbench.protocol.events import Error
from workbench.engine.memory.cgroup import MemoryCeiling
from workbench.engine.memory.device import GpuMemory
from workbench.engine.memory.host import HostMemory
from workbench.engine.memory.sampler import MemorySample
from workbench.engine.memory_guard import MemoryGuard, MemoryLimitNear

MB = 1 << 20
GB = 1 << 30


def host(rss: int, limit: int | None = 2 * GB) -> HostMemory:
    ceiling = MemoryCeiling(limit, "cgroup v1 /job", rss, 0, "cgroup v1 /job") if limit else None
    return HostMemory(rss=rss, rss_anon=rss, rss_file=0, system_total=24 * GB, system_available=20 * GB, swap_used=0,
                      ceiling=ceiling)


def run(guard: MemoryGuard, samples: list[MemorySample]) -> None:
    for sample in samples:
        guard.observe(sample)


def test_a_host_leak_under_a_cgroup_warns_once_then_hands_the_act_to_the_training_thread() -> None:
    published, acted = [], []
    guard = MemoryGuard(published.append, acted.append, seconds_to_act=lambda: 6.0)
    run(guard, [MemorySample(time=i / 10, host=host(int(0.5 * GB + 60 * MB * i / 10))) for i in range(260)])
    warnings = [e for e in published if isinstance(e, Error) and e.where == "memory limit"]
    assert len(warnings) == 1 and warnings[0].is_warning
    assert "host memory grows 60.00 MiB/s: the 2.00 GiB limit (cgroup v1 /job) in ~" in warnings[0].message
    assert len(acted) == 1 and isinstance(acted[0], MemoryLimitNear) and acted[0].what == "host"
    assert guard.warning is not None and guard.warning.startswith("host memory grows")


def test_warn_only_never_acts_and_a_gpu_is_watched_against_what_the_process_may_use() -> None:
    published, acted = [], []
    guard = MemoryGuard(published.append, acted.append, seconds_to_act=lambda: 6.0, action="warn")
    samples = [
        MemorySample(time=i / 10, host=host(GB), gpus=(GpuMemory(index=0, name="fake", allocated=int(GB + 100 * MB * i / 10),
                                                                 device_total=80 * GB, limit=4 * GB,
                                                                 limit_source="set_per_process_memory_fraction(0.05)"),))
        for i in range(300)
    ]
    run(guard, samples)
    assert acted == []
    (warning,) = [e for e in published if e.where == "memory limit"]
    assert warning.message.startswith("cuda:0 memory grows") and "the 4.00 GiB it may use (set_per_process_memory_fraction(0.05)) in ~" in warning.message


def test_no_limit_means_the_machines_free_memory_is_the_ceiling() -> None:
    published, acted = [], []
    guard = MemoryGuard(published.append, acted.append, seconds_to_act=lambda: 6.0)
    run(guard, [MemorySample(time=i / 10, host=host(GB, limit=None)) for i in range(300)])
    assert published == [] and acted == [] and guard.warning is None


def test_the_leak_report_of_a_memory_limit_shows_in_the_log_with_its_largest_suspects(tmp_path) -> None:
    from rich.text import Text

    from workbench.protocol.events import LeaksFound
    from workbench.frontends.tui.widgets.reload_log import render_entry

    event = LeaksFound(step=40, total_bytes=1400 * MB, unowned_bytes=1300 * MB, seconds=0.2, groups=(),
                       suspects=({"description": "train.KEPT: list of 65 tensors", "bytes": 1300 * MB, "referrers": (), "count": 65},))
    line = render_entry(event, tmp_path, timestamps=False)
    assert isinstance(line, Text)
    assert line.plain == ("LEAKS 1.27 GiB of 1.37 GiB in tensors no model, optimizer or state owns; largest: "
                          "train.KEPT: list of 65 tensors (1.27 GiB)")
