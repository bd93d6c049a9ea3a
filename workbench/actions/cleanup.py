"""Give memory back: drop stale tracebacks, collect garbage, empty torch's cache.

Reports before and after for host RSS and every GPU, and how much came back.
"""

from __future__ import annotations

import gc
import sys

from workbench.events import Cleanup
from workbench.memory.device import DeviceProbe
from workbench.memory.sampler import MemorySample, take_sample


def _figures(sample: MemorySample) -> dict[str, int]:
    out = {"rss": sample.host.rss}
    for gpu in sample.gpus:
        for field in ("allocated", "reserved", "device_used"):
            value = getattr(gpu, field)
            if value is not None:
                out[f"cuda:{gpu.index}.{field}"] = value
    return out


def run_cleanup(probe: DeviceProbe) -> Cleanup:
    before = take_sample(probe)
    # A traceback kept for the last exception pins the frames, and their tensors, alive.
    sys.last_traceback = sys.last_value = sys.last_type = None  # type: ignore[assignment]
    if hasattr(sys, "last_exc"):
        sys.last_exc = None  # type: ignore[attr-defined]
    gc.collect()
    probe.empty_cache()
    probe.reset_peaks()
    after = take_sample(probe)
    b, a = _figures(before), _figures(after)
    gpu_freed = sum(max(b[k] - a.get(k, 0), 0) for k in b if k.endswith(".reserved"))
    freed = gpu_freed if before.gpus else max(b["rss"] - a["rss"], 0)
    return Cleanup(freed_bytes=freed, before=b, after=a)
