"""torch.profiler over the next N steps; the Chrome trace (gzip) opens in Perfetto."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from workbench.protocol.events import Profile

TOP_OPS = 10


class ProfileRun:
    """Started before a step, fed each finished step, finished after the last one."""

    def __init__(self, steps: int, run_dir: Path, code_version: int, cuda: bool, warmup: int = 1) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.steps = steps
        self.remaining = steps + warmup  # the first step warms up (allocator, kernels) and is not recorded
        self._run_dir = run_dir
        self._code_version = code_version
        self._cuda = cuda
        self._profiler = profile(
            activities=activities,
            profile_memory=True,
            record_shapes=True,
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        )
        self._profiler.__enter__()

    def step_done(self) -> bool:
        """Count a finished step; True when enough steps were recorded."""
        self.remaining -= 1
        self._profiler.step()
        return self.remaining <= 0

    def finish(self) -> Profile:
        self._profiler.__exit__(None, None, None)
        folder = self._run_dir / "traces"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"trace-{time.strftime('%Y%m%d-%H%M%S')}-v{self._code_version}.json.gz"
        self._profiler.export_chrome_trace(str(path))
        return Profile(status="done", steps=self.steps, trace=str(path), top_ops=tuple(self._top_ops()))

    def abort(self) -> None:
        self._profiler.__exit__(None, None, None)

    def _top_ops(self) -> list[dict[str, Any]]:
        """The top operators by self CPU time, then (if not already listed) by memory allocated."""
        averages = list(self._profiler.key_averages())
        by_time = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP_OPS]
        by_memory = sorted(averages, key=lambda e: abs(getattr(e, "self_cpu_memory_usage", 0) or 0), reverse=True)
        rows = by_time + [e for e in by_memory[:TOP_OPS] if e not in by_time and getattr(e, "self_cpu_memory_usage", 0)]
        out = []
        for e in rows:
            row: dict[str, Any] = {
                "name": e.key,
                "calls": e.count,
                "self_cpu_ms": round(e.self_cpu_time_total / 1000, 3),
                "cpu_memory_bytes": int(getattr(e, "self_cpu_memory_usage", 0) or 0),
            }
            if self._cuda:
                row["self_cuda_ms"] = round(getattr(e, "self_device_time_total", 0) / 1000, 3)
            out.append(row)
        return out
