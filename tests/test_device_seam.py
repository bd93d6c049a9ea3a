"""The real device probe against a fake driver: values, errors as N/A, no driver, UUID mapping."""

from __future__ import annotations

import pytest

from tests.fakes import GiB, FakeCuda, FakeGpu, FakeNvml
from workbench.engine.memory.device import TorchNvmlProbe

STATS = {
    "allocated_bytes.all.current": 3 * GiB,
    "reserved_bytes.all.current": 5 * GiB,
    "allocated_bytes.all.peak": 4 * GiB,
    "reserved_bytes.all.peak": 6 * GiB,
    "inactive_split_bytes.all.current": 1 * GiB,
    "num_alloc_retries": 2,
    "num_ooms": 0,
    "allocation.all.allocated": 12345,
}


def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid="GPU-aaaa-0000", name="Fake A", used=7 * GiB, processes={4242: 6 * GiB}),
        FakeGpu(uuid="GPU-bbbb-1111", name="Fake B", used=1 * GiB),
        FakeGpu(uuid="GPU-cccc-2222", name="Fake C", used=2 * GiB),
    ]


def probe_for(visible: list[FakeGpu], nvml: FakeNvml, **cuda_kwargs) -> TorchNvmlProbe:
    return TorchNvmlProbe(cuda=FakeCuda(visible, {0: STATS}, **cuda_kwargs), load_nvml=lambda: nvml, pid=4242)


def test_values_come_from_the_allocator_and_nvml():
    all_gpus = gpus()
    gpu = probe_for(all_gpus[:1], FakeNvml(all_gpus)).gpus()[0]
    assert (gpu.allocated, gpu.reserved, gpu.peak_allocated, gpu.peak_reserved) == (3 * GiB, 5 * GiB, 4 * GiB, 6 * GiB)
    assert (gpu.inactive_split, gpu.alloc_retries, gpu.ooms, gpu.allocations) == (1 * GiB, 2, 0, 12345)
    assert gpu.fragmentation == pytest.approx(0.2)
    assert (gpu.device_used, gpu.device_total, gpu.process_used) == (7 * GiB, 40 * GiB, 6 * GiB)
    assert (gpu.utilization, gpu.temperature, gpu.power_watts) == (87, 61, 250.0)


def test_the_step_peak_is_the_allocators_peak_and_none_before_cuda_starts():
    all_gpus = gpus()
    assert probe_for(all_gpus[:1], FakeNvml(all_gpus)).peak_allocated(0) == 4 * GiB
    assert probe_for(all_gpus[:1], FakeNvml(all_gpus), initialized=False).peak_allocated(0) is None


def test_torch_devices_map_to_nvml_devices_by_uuid_under_cuda_visible_devices(monkeypatch):
    all_gpus = gpus()
    # CUDA_VISIBLE_DEVICES=2,0: torch's cuda:0 is NVML's device 2, torch's cuda:1 is NVML's device 0.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    probe = probe_for([all_gpus[2], all_gpus[0]], FakeNvml(all_gpus))
    first, second = probe.gpus()
    assert (first.name, first.device_used) == ("Fake C", 2 * GiB)
    assert (second.name, second.device_used) == ("Fake A", 7 * GiB)


def test_without_a_uuid_from_torch_cuda_visible_devices_indices_are_followed(monkeypatch):
    all_gpus = gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = probe_for([all_gpus[1]], FakeNvml(all_gpus), with_uuid=False).gpus()[0]
    assert gpu.device_used == 1 * GiB


def test_device_used_is_what_nvidia_smi_shows_without_the_drivers_reservation():
    # Seen on an H100 (driver 580): NVML's v1 reading said 5103 MiB used where nvidia-smi said 4623.
    all_gpus = [FakeGpu(uuid="GPU-aaaa-0000", used=7 * GiB, driver_reserved=480 * 2**20)]
    gpu = probe_for(all_gpus, FakeNvml(all_gpus)).gpus()[0]
    assert gpu.device_used == 7 * GiB


def test_a_driver_without_the_v2_memory_reading_falls_back_to_v1_and_keeps_reading():
    all_gpus = [FakeGpu(uuid="GPU-aaaa-0000", used=7 * GiB, driver_reserved=480 * 2**20)]
    probe = probe_for(all_gpus, FakeNvml(all_gpus, unsupported={"nvmlDeviceGetMemoryInfo_v2"}))
    assert probe.gpus()[0].device_used == 7 * GiB + 480 * 2**20
    all_gpus[0].used = 8 * GiB
    assert probe.gpus()[0].device_used == 8 * GiB + 480 * 2**20
    assert probe.unavailable_reason() is None  # v1 still gives device memory: nothing to report missing


def test_before_cuda_starts_the_allocator_holds_nothing_rather_than_not_available():
    # Seen on an H100: torch.cuda.memory_stats() is {} until CUDA is initialized, which read as n/a.
    all_gpus = gpus()
    probe = TorchNvmlProbe(cuda=FakeCuda(all_gpus[:1], {}, initialized=False), load_nvml=lambda: FakeNvml(all_gpus), pid=4242)
    gpu = probe.gpus()[0]
    assert (gpu.allocated, gpu.reserved, gpu.peak_allocated, gpu.ooms) == (0, 0, 0, 0)
    assert gpu.device_used == 7 * GiB


def test_functions_missing_from_an_old_driver_become_not_available_and_are_named_once():
    all_gpus = gpus()
    nvml = FakeNvml(all_gpus, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"})
    probe = probe_for(all_gpus[:1], nvml)
    gpu = probe.gpus()[0]
    assert gpu.power_watts is None and gpu.temperature is None
    assert gpu.utilization == 87 and gpu.device_used == 7 * GiB
    assert probe.unavailable_reason() == "Not available from this driver: power, temperature."
    probe.gpus()
    assert probe.unavailable_reason() == "Not available from this driver: power, temperature."


def test_a_lost_gpu_reads_as_not_available_and_the_probe_keeps_working():
    all_gpus = gpus()
    probe = probe_for(all_gpus[:1], FakeNvml(all_gpus))
    assert probe.gpus()[0].device_used == 7 * GiB
    all_gpus[0].lost = True
    gpu = probe.gpus()[0]
    assert gpu.device_used is None and gpu.utilization is None
    assert gpu.allocated == 3 * GiB, "torch's own figures still come through"
    assert "device memory" in probe.unavailable_reason()


def test_no_nvml_library_or_driver_keeps_allocator_figures_and_says_so():
    def missing():
        raise ImportError("No module named 'pynvml'")

    probe = TorchNvmlProbe(cuda=FakeCuda(gpus()[:1], {0: STATS}), load_nvml=missing)
    gpu = probe.gpus()[0]
    assert gpu.allocated == 3 * GiB and gpu.device_used is None
    assert probe.unavailable_reason().startswith("NVML is not available (No module named 'pynvml')")
    failing = probe_for(gpus()[:1], FakeNvml(gpus(), init_error="Driver Not Loaded"))
    assert failing.gpus()[0].device_total is None
    assert "Driver Not Loaded" in failing.unavailable_reason()


def test_no_gpu_at_all():
    probe = TorchNvmlProbe(cuda=FakeCuda([]), load_nvml=lambda: FakeNvml([]))
    assert probe.gpus() == [] and not probe.available()
    assert probe.unavailable_reason().startswith("No GPU")
    probe.empty_cache()  # nothing to do, and no error
