"""Give memory back: drop stale tracebacks, collect garbage, empty torch's cache, trim the C heap.

Reports before and after for host RSS and every GPU, and how much came back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache

from workbench.protocol.events import Cleanup
from workbench.engine.memory.device import DeviceProbe
from workbench.engine.memory.gc_freeze import collect_all
from workbench.engine.memory.sampler import MemorySample, take_sample


def _figures(sample: MemorySample) -> dict[str, int]:
    out = {"rss": sample.host.rss}
    for gpu in sample.gpus:
        for field in ("allocated", "reserved", "device_used"):
            value = getattr(gpu, field)
            if value is not None:
                out[f"cuda:{gpu.index}.{field}"] = value
    return out


@cache
def _malloc_trim():  # type: ignore[no-untyped-def]
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def trim_c_heap() -> bool:
    """Hand freed heap pages back to the system (glibc keeps them for reuse, so RSS would not fall).

    CPU tensors come from the C heap: after a leak is fixed, its memory is free but still resident
    until this runs. Returns whether it could run.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def run_cleanup(probe: DeviceProbe) -> Cleanup:
    before = take_sample(probe)
    # A traceback kept for the last exception pins the frames, and their tensors, alive.
    sys.last_traceback = sys.last_value = sys.last_type = None  # type: ignore[assignment]
    if hasattr(sys, "last_exc"):
        sys.last_exc = None  # type: ignore[attr-defined]
    collect_all()  # frozen objects too: what setup() built and later dropped in a cycle
    probe.empty_cache()
    trim_c_heap()
    probe.reset_peaks()
    after = take_sample(probe)
    b, a = _figures(before), _figures(after)
    gpu_freed = sum(max(b[k] - a.get(k, 0), 0) for k in b if k.endswith(".reserved"))
    freed = gpu_freed if before.gpus else max(b["rss"] - a["rss"], 0)
    return Cleanup(freed_bytes=freed, before=b, after=a)
