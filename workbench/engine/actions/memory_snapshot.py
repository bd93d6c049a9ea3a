"""CUDA memory snapshots for pytorch.org/memory_viz: record allocation history, dump it, summarise it.

Recording uses python stacks only: dumping with C++ stacks has been measured at
minutes. The pickle is written with protocol 4, which memory_viz reads (5 it rejects).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from workbench.engine.actions.leftovers import temp_prefix

from workbench.protocol.events import MemorySnapshotTaken
from workbench.units import human_bytes

MAX_ENTRIES = 100_000
_TOP = 5


class NeedsCuda(RuntimeError):
    """The action only means something with CUDA's caching allocator."""


def start_recording(max_entries: int = MAX_ENTRIES) -> None:
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)


def dump_snapshot(run_dir: Path, cuda_available: bool, recording: bool, reason: str = "requested") -> MemorySnapshotTaken:
    if not cuda_available:
        raise NeedsCuda(
            "CUDA memory snapshots need a CUDA device, and this session has none. For host memory, use the "
            "breakdown (b) and the leak finder (t)."
        )
    snapshot = torch.cuda.memory._snapshot()
    folder = run_dir / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"snapshot-{time.strftime('%Y%m%d-%H%M%S')}-{reason}.pickle"
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(), suffix=".pickle", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    summary = summarize(snapshot)
    if not recording:
        summary.insert(0, "allocation history was not recorded (start with --record-memory for stacks and a timeline)")
    return MemorySnapshotTaken(path=str(final), bytes=final.stat().st_size, reason=reason, summary=tuple(summary))


def summarize(snapshot: dict[str, Any]) -> list[str]:
    """The largest segments and live allocations, one line each."""
    segments = snapshot.get("segments", [])
    lines = [f"{len(segments)} segments, {human_bytes(sum(s.get('total_size', 0) for s in segments))} reserved"]
    for seg in sorted(segments, key=lambda s: s.get("total_size", 0), reverse=True)[:_TOP]:
        lines.append(
            f"segment cuda:{seg.get('device', 0)} {human_bytes(seg.get('total_size'))} "
            f"({human_bytes(seg.get('allocated_size'))} allocated, {seg.get('segment_type', '?')} pool)"
        )
    blocks = [b for seg in segments for b in seg.get("blocks", []) if b.get("state") == "active_allocated"]
    for block in sorted(blocks, key=lambda b: b.get("size", 0), reverse=True)[:_TOP]:
        frames = block.get("frames") or []
        where = next((f"{f['filename']}:{f['line']} {f['name']}" for f in frames if "site-packages" not in f.get("filename", "")), "")
        lines.append(f"allocation {human_bytes(block.get('size'))} {where}".rstrip())
    lines.append("open it at https://pytorch.org/memory_viz (drag the .pickle file onto the page)")
    return lines
