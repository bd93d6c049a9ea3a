"""The real ceiling: the memory cgroup's limit (v1 and v2, nested), else the host's RAM.

The reader runs against v1 and v2 layouts written into a temporary folder (always),
and against a real memory cgroup that the test creates when this machine lets it
(skipped, with the reason, where it does not): a child run inside it reports the
cgroup's limit, and an OOM kill inside it is reported to the next run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TRAIN_PY, make_project

from tests.fakes import FakeCuda, FakeGpu, FakeNvml, GiB, frozen_host
from workbench.engine.memory.cgroup import (
    CgroupReader,
    MemoryCeiling,
    find_memory_cgroup,
    previous_oom_kills_note,
)
from workbench.engine.memory.device import TorchNvmlProbe
from workbench.engine.memory.host import HostMemory, read_host_memory
from workbench.engine.memory.sampler import MemorySample, take_sample
from workbench.frontends.tui.widgets.memory_gauges import render_memory

V1_UNLIMITED = "9223372036854771712"
HOST = 24 * GiB


# --------------------------------------------------------------------------- layouts in a temporary folder


def write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def proc_files(tmp_path: Path, cgroup: str, mounts: list[str]) -> tuple[Path, Path]:
    """/proc/self/cgroup and /proc/self/mountinfo as a process would see them."""
    proc_cgroup, mountinfo = tmp_path / "cgroup", tmp_path / "mountinfo"
    proc_cgroup.write_text(cgroup)
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "31 22 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" + "".join(m + "\n" for m in mounts)
    )
    return proc_cgroup, mountinfo


def v2_layout(tmp_path: Path, job_max: str = str(2 * GiB), slice_max: str = "max") -> CgroupReader:
    """cgroup v2: the process in /user.slice/job-1/step; a limit on job-1 (and maybe user.slice)."""
    mount = tmp_path / "unified"
    write(mount, {"cgroup.controllers": "cpu memory pids\n"})  # the root cgroup has no memory.max
    write(mount / "user.slice", {"memory.max": f"{slice_max}\n", "memory.current": "3000000000\n"})
    write(mount / "user.slice/job-1", {"memory.max": f"{job_max}\n", "memory.current": "1500000000\n"})
    write(
        mount / "user.slice/job-1/step",
        {
            "memory.max": "max\n",
            "memory.current": "1200000000\n",
            "memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n",
        },
    )
    files = proc_files(tmp_path, "0::/user.slice/job-1/step\n", [f"41 31 0:38 / {mount} rw,nosuid - cgroup2 cgroup2 rw"])
    return CgroupReader.for_this_process(*files, host_total=HOST)


def v1_container_layout(tmp_path: Path, limit: str = str(512 * 1024**2), *, hierarchical: int | None = None) -> CgroupReader:
    """cgroup v1 as a container (no cgroup namespace) sees it: the mount's root is /docker/abc."""
    mount = tmp_path / "memory dir"  # a space: mountinfo writes it as \040
    stat = f"cache 0\nrss 0\nhierarchical_memory_limit {hierarchical or V1_UNLIMITED}\n"
    write(
        mount,
        {
            "memory.limit_in_bytes": f"{limit}\n",
            "memory.usage_in_bytes": "400000000\n",
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
            "memory.stat": stat,
        },
    )
    escaped = str(mount).replace(" ", "\\040")
    files = proc_files(
        tmp_path,
        "12:pids:/docker/abc\n4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        [
            f"35 31 0:32 /docker/abc {escaped} rw,nosuid - cgroup cgroup rw,memory",
            f"36 31 0:33 /docker/abc {tmp_path / 'cpu'} rw,nosuid - cgroup cgroup rw,cpu,cpuacct",
        ],
    )
    return CgroupReader.for_this_process(*files, host_total=HOST)


def test_v2_the_nearest_limit_applies_with_its_usage_and_the_own_cgroups_oom_kills(tmp_path):
    ceiling = v2_layout(tmp_path).read()
    assert ceiling == MemoryCeiling(
        limit_bytes=2 * GiB,
        limit_source="cgroup v2 /user.slice/job-1",
        usage_bytes=1_500_000_000,  # what counts against that limit: job-1's, not the step's
        oom_kills=2,
        cgroup="cgroup v2 /user.slice/job-1/step",
    )


def test_v2_nested_limits_the_smallest_applies(tmp_path):
    ceiling = v2_layout(tmp_path, job_max=str(4 * GiB), slice_max=str(3 * GiB)).read()
    assert (ceiling.limit_bytes, ceiling.limit_source, ceiling.usage_bytes) == (3 * GiB, "cgroup v2 /user.slice", 3_000_000_000)


def test_v2_without_any_limit_the_host_is_the_ceiling(tmp_path):
    ceiling = v2_layout(tmp_path, job_max="max").read()
    assert (ceiling.limit_bytes, ceiling.limit_source) == (HOST, "host")
    assert ceiling.usage_bytes == 1_200_000_000  # the process's own cgroup, for the record
    assert ceiling.cgroup == "cgroup v2 /user.slice/job-1/step"


def test_a_limit_above_the_machines_ram_is_not_the_ceiling(tmp_path):
    ceiling = v2_layout(tmp_path, job_max=str(64 * GiB)).read()
    assert (ceiling.limit_bytes, ceiling.limit_source) == (HOST, "host")


def test_v1_in_a_container_maps_the_cgroup_path_through_the_mounts_root(tmp_path):
    reader = v1_container_layout(tmp_path)
    assert reader.location is not None and reader.location.chain[0][1] == tmp_path / "memory dir"
    ceiling = reader.read()
    assert ceiling == MemoryCeiling(
        limit_bytes=512 * 1024**2,
        limit_source="cgroup v1 /docker/abc",
        usage_bytes=400_000_000,
        oom_kills=0,
        cgroup="cgroup v1 /docker/abc",
    )
    assert previous_oom_kills_note(ceiling) is None


def test_v1_unlimited_is_no_limit(tmp_path):
    ceiling = v1_container_layout(tmp_path, V1_UNLIMITED).read()
    assert (ceiling.limit_bytes, ceiling.limit_source, ceiling.usage_bytes) == (HOST, "host", 400_000_000)


def test_v1_a_smaller_limit_above_the_mount_counts(tmp_path):
    """The mount shows only the container's subtree; memory.stat says what limit is in force above it."""
    ceiling = v1_container_layout(tmp_path, V1_UNLIMITED, hierarchical=GiB).read()
    assert (ceiling.limit_bytes, ceiling.limit_source) == (GiB, "cgroup v1 /docker/abc (a parent's limit)")


def test_v1_nested_folders_under_a_host_mount(tmp_path):
    """No namespace: the mount's root is /, the process sits two levels down, the middle one limits."""
    mount = tmp_path / "memory"
    write(mount, {"memory.limit_in_bytes": V1_UNLIMITED, "memory.usage_in_bytes": "9000000000"})
    write(mount / "slurm", {"memory.limit_in_bytes": str(6 * GiB), "memory.usage_in_bytes": "5000000000"})
    write(mount / "slurm/job_7", {"memory.limit_in_bytes": str(8 * GiB), "memory.usage_in_bytes": "4000000000",
                                  "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"})
    files = proc_files(tmp_path, "4:memory:/slurm/job_7\n0::/\n", [f"35 31 0:32 / {mount} rw - cgroup cgroup rw,memory"])
    ceiling = CgroupReader.for_this_process(*files, host_total=HOST).read()
    assert (ceiling.limit_bytes, ceiling.limit_source, ceiling.usage_bytes, ceiling.oom_kills) == (
        6 * GiB, "cgroup v1 /slurm", 5_000_000_000, 1,
    )


def test_hybrid_systems_read_the_v1_memory_hierarchy(tmp_path):
    v1 = v1_container_layout(tmp_path / "a")
    unified = tmp_path / "a" / "unified"
    write(unified, {"cgroup.controllers": ""})  # hybrid: no memory controller on the unified hierarchy
    mountinfo = (tmp_path / "a" / "mountinfo").read_text() + f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
    (tmp_path / "a" / "mountinfo").write_text(mountinfo)
    location = find_memory_cgroup(tmp_path / "a" / "cgroup", tmp_path / "a" / "mountinfo")
    assert location is not None and location.version == 1 and v1.read().limit_source == "cgroup v1 /docker/abc"


def test_nothing_to_read_means_the_host(tmp_path):
    assert find_memory_cgroup(tmp_path / "missing", tmp_path / "missing") is None
    files = proc_files(tmp_path, "0::/\n", [f"41 31 0:38 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw"])
    write(tmp_path / "unified", {"cgroup.controllers": "cpu\n"})  # the root cgroup: no memory files
    reader = CgroupReader.for_this_process(*files, host_total=HOST)
    assert reader.location is None
    assert reader.read() == MemoryCeiling(HOST, "host")
    assert previous_oom_kills_note(reader.read()) is None


def test_usage_is_read_every_time_and_limits_every_few_seconds(tmp_path):
    now = [100.0]
    reader = v2_layout(tmp_path)
    reader = CgroupReader(reader.location, host_total=HOST, refresh_every=5.0, clock=lambda: now[0])
    job = tmp_path / "unified/user.slice/job-1"
    assert reader.read().limit_bytes == 2 * GiB
    (job / "memory.current").write_text("1600000000\n")
    (job / "memory.max").write_text(str(GiB))
    assert (reader.read().usage_bytes, reader.read().limit_bytes) == (1_600_000_000, 2 * GiB)
    now[0] += 5.0
    assert reader.read().limit_bytes == GiB
    (job / "memory.max").write_text("max\n")
    now[0] += 5.0
    ceiling = reader.read()
    assert (ceiling.limit_source, ceiling.usage_bytes) == ("host", 1_200_000_000)  # back to the own cgroup's usage


def test_a_previous_oom_kill_is_one_plain_sentence(tmp_path):
    note = previous_oom_kills_note(v2_layout(tmp_path).read())
    assert note is not None
    assert "killed 2 processes" in note and "cgroup v2 /user.slice/job-1/step" in note
    assert "2.00 GiB (cgroup v2 /user.slice/job-1)" in note and "lower the batch size" in note


# --------------------------------------------------------------------------- event and gauge


def test_the_memory_event_carries_the_ceiling(tmp_path):
    ceiling = v2_layout(tmp_path).read()
    host = HostMemory(**{**frozen_host().__dict__, "ceiling": ceiling})
    event = MemorySample(time=0.0, host=host).to_event().to_dict()
    assert (event["limit_bytes"], event["limit_source"], event["cgroup_usage_bytes"]) == (
        2 * GiB, "cgroup v2 /user.slice/job-1", 1_500_000_000,
    )
    plain = MemorySample(time=0.0, host=frozen_host()).to_event().to_dict()
    assert (plain["limit_bytes"], plain["limit_source"], plain["cgroup_usage_bytes"]) == (24 * GiB, "host", None)


def test_this_process_reading_has_a_ceiling():
    host = read_host_memory()
    assert host.ceiling is not None and host.limit > 0
    assert host.limit_source == "host" or host.limit_source.startswith("cgroup v")
    event = take_sample(TorchNvmlProbe(cuda=FakeCuda([]))).to_event().to_dict()
    assert event["limit_bytes"] == host.limit


def gauge_text(host: HostMemory) -> str:
    return " ".join(render_memory(MemorySample(time=0.0, host=host), 20).plain.split())


def test_the_host_gauge_is_drawn_against_the_cgroup_limit_and_says_so(tmp_path):
    ceiling = MemoryCeiling(2 * GiB, "cgroup v1 /docker/abc", usage_bytes=int(1.9 * GiB), oom_kills=0, cgroup="cgroup v1 /docker/abc")
    host = HostMemory(**{**frozen_host().__dict__, "ceiling": ceiling})
    text = render_memory(MemorySample(time=0.0, host=host), 20)
    plain = " ".join(text.plain.split())
    assert "of cgroup limit 2.00 GiB" in plain and "cgroup in use 1.90 GiB" in plain
    assert "of 24.00 GiB in use" in plain  # the machine's RAM line stays
    rss_bar = text.plain.splitlines()[1]
    assert rss_bar.count("█") == round(1.5 / 2 * 20), rss_bar  # RSS 1.5 GiB of a 2 GiB ceiling
    assert "cgroup" not in gauge_text(frozen_host())  # on the host: as before


# --------------------------------------------------------------------------- GPU ceiling, through the seam


class CudaWithCeiling(FakeCuda):
    """FakeCuda plus what the ceiling needs: total_memory, is_initialized, the per-process fraction."""

    def __init__(self, gpus, *, total: int, fraction: float = 1.0, initialized: bool = True, name: str | None = None):
        super().__init__(gpus)
        self.total, self.fraction, self.initialized, self.name = total, fraction, initialized, name
        self.fraction_reads = 0

    def get_device_name(self, index: int) -> str:
        return self.name or super().get_device_name(index)

    def get_device_properties(self, index: int):
        props = super().get_device_properties(index)
        props.total_memory = self.total
        return props

    def is_initialized(self) -> bool:
        return self.initialized

    def get_per_process_memory_fraction(self, index: int) -> float:
        self.fraction_reads += 1
        return self.fraction


def one_gpu(cuda_factory, **kwargs):
    gpu = FakeGpu(uuid="GPU-aaaa-0000", total=80 * GiB)
    cuda = cuda_factory([gpu], **kwargs)
    return TorchNvmlProbe(cuda=cuda, load_nvml=lambda: FakeNvml([gpu])).gpus()[0], cuda


def test_gpu_ceiling_is_the_device_unless_a_fraction_or_a_mig_slice_says_less():
    gpu, _ = one_gpu(CudaWithCeiling, total=79 * GiB)
    assert (gpu.limit, gpu.limit_source) == (79 * GiB, "device")  # what torch can use: less than NVML's 80
    gpu, _ = one_gpu(CudaWithCeiling, total=80 * GiB, fraction=0.5)
    assert (gpu.limit, gpu.limit_source) == (40 * GiB, "set_per_process_memory_fraction(0.50)")
    gpu, cuda = one_gpu(CudaWithCeiling, total=80 * GiB, fraction=0.5, initialized=False)
    assert (gpu.limit, gpu.limit_source, cuda.fraction_reads) == (80 * GiB, "device", 0)  # never initializes CUDA
    gpu, _ = one_gpu(CudaWithCeiling, total=10 * GiB, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb")
    assert (gpu.limit, gpu.limit_source) == (10 * GiB, "MIG slice")


def test_gpu_ceiling_falls_back_to_nvml_and_shows_on_the_gauge():
    gpu, _ = one_gpu(FakeCuda)  # no total_memory from torch: NVML's total
    assert (gpu.limit, gpu.limit_source) == (80 * GiB, "device")
    assert "may use" not in gauge_text_with_gpu(gpu)
    gpu, _ = one_gpu(CudaWithCeiling, total=80 * GiB, fraction=0.25)
    assert gpu.to_dict()["limit"] == 20 * GiB
    assert "this process may use 20.00 GiB (set_per_process_memory_fraction(0.25))" in gauge_text_with_gpu(gpu)


def gauge_text_with_gpu(gpu) -> str:
    return " ".join(render_memory(MemorySample(time=0.0, host=frozen_host(), gpus=(gpu,)), 20).plain.split())


# --------------------------------------------------------------------------- a real memory cgroup


def real_cgroup(limit: int) -> Iterator[tuple[Path, str, int]]:
    """A fresh memory cgroup with `limit`, as (folder, cgroup path, version); skips saying why when it cannot."""
    location = find_memory_cgroup()
    if location is None:
        pytest.skip("no memory cgroup is visible to this process (/proc/self/cgroup, /proc/self/mountinfo)")
    limit_file = "memory.limit_in_bytes" if location.version == 1 else "memory.max"
    tried = []
    for cg_path, parent in location.chain:  # v2 can enable memory for a child only where no process sits
        folder = parent / f"vram-bench-test-{os.getpid()}-{time.monotonic_ns()}"
        try:
            folder.mkdir()
        except OSError as exc:
            tried.append(f"mkdir {folder}: {exc.strerror}")
            continue
        try:
            (folder / limit_file).write_text(str(limit))
            if location.version == 1 and (folder / "memory.memsw.limit_in_bytes").exists():
                (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no swapping past it
            elif location.version == 2 and (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0")
        except OSError as exc:
            tried.append(f"{folder / limit_file}: {exc.strerror}")
            folder.rmdir()
            continue
        try:
            yield folder, f"{cg_path.rstrip('/')}/{folder.name}", location.version
        finally:
            for _ in range(50):  # the cgroup empties a moment after its last process is reaped
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return
    pytest.skip(f"cannot create a memory cgroup with a limit here (cgroup v{location.version}): {'; '.join(tried)}")


@pytest.fixture
def cgroup_2gib() -> Iterator[tuple[Path, str, int]]:
    yield from real_cgroup(2 * GiB)


@pytest.fixture
def cgroup_64mib() -> Iterator[tuple[Path, str, int]]:
    yield from real_cgroup(64 * 1024**2)


def in_cgroup(folder: Path, argv: list[str]) -> list[str]:
    """argv run by a shell that first moves itself into the cgroup, so every byte of the child counts there."""
    return ["sh", "-c", f'echo $$ > "{folder}/cgroup.procs" && exec "$@"', "sh", *argv]


def test_a_run_inside_a_real_memory_cgroup_shows_its_limit(tmp_path, cgroup_2gib):
    folder, cg_path, version = cgroup_2gib
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    proc = subprocess.Popen(
        in_cgroup(folder, [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    memory = None
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            event = json.loads(line)
            if event["event"] == "memory":
                memory = event
                break
        proc.stdin.write("quit\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert memory is not None, proc.stderr.read()  # type: ignore[union-attr]
    assert memory["limit_bytes"] == 2 * GiB
    assert memory["limit_source"] == f"cgroup v{version} {cg_path}"
    assert 0 < memory["cgroup_usage_bytes"] <= 2 * GiB
    assert memory["cgroup_usage_bytes"] >= memory["rss_anon_bytes"] // 2  # the run's own memory is charged there


def test_an_oom_kill_in_the_cgroup_is_reported_to_the_next_run(tmp_path, cgroup_64mib):
    folder, cg_path, version = cgroup_64mib
    hog = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    killed = subprocess.run(in_cgroup(folder, [sys.executable, "-c", hog]), capture_output=True, timeout=60, check=False)
    if killed.returncode != -9:
        pytest.skip(f"the kernel did not OOM-kill the child in a 64 MiB cgroup (exit {killed.returncode})")
    # The next run in the same cgroup: a reader that sees this process where the child was.
    line = f"4:memory:{cg_path}\n" if version == 1 else f"0::{cg_path}\n"
    (tmp_path / "cgroup").write_text(line)
    reader = CgroupReader.for_this_process(tmp_path / "cgroup", "/proc/self/mountinfo")
    ceiling = reader.read()
    reader.close()
    assert (ceiling.limit_bytes, ceiling.limit_source, ceiling.oom_kills) == (64 * 1024**2, f"cgroup v{version} {cg_path}", 1)
    note = previous_oom_kills_note(ceiling)
    assert note is not None and "killed 1 process in" in note and "64.00 MiB" in note, note
