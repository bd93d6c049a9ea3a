"""Training throughput with the memory sampler on (10 Hz) versus off, in the same run.

Runs the default sample project (tiny_gpt) headless-style in-process, alternating
on/off rounds so drift on the machine hits both alike; the figure is the ratio of
steps/s (target: >= 99%).

    python bench/sampler_overhead.py                 # 4 rounds of 150 steps each way
    python bench/sampler_overhead.py --rounds 6 --steps 300 --hz 10
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.protocol.events import Exit, Step  # noqa: E402
from workbench.engine.project import load_project  # noqa: E402
from workbench.engine.session import Session, SessionConfig  # noqa: E402


def steps_per_second(entry: Path, steps: int, sample: bool, hz: float, device: str) -> float:
    config = SessionConfig(
        device=torch.device(device),
        max_steps=steps,
        watch=False,
        sample_memory=sample,
        memory_interval=1.0 / hz,
        memory_event_interval=2.0,
    )
    session = Session(load_project(entry), config)
    events = session.bus.subscribe(maxlen=1_000_000)
    session.start()
    times: list[float] = []
    try:
        while True:
            batch = events.wait(0.5)
            times.extend(e.time for e in batch if isinstance(e, Step))
            if any(isinstance(e, Exit) for e in batch):
                break
    finally:
        session.close()
    measured = times[len(times) // 5 :]  # skip warm-up
    return (len(measured) - 1) / (measured[-1] - measured[0])


def per_call(fn, calls: int = 2000) -> float:
    """Seconds per call, the median of 5 batches (this machine's other work shows up as outliers)."""
    batches = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        batches.append((time.perf_counter() - started) / (calls // 5))
    return statistics.median(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: on a GPU the sample reads NVML and the allocator too")
    args = parser.parse_args()
    on: list[float] = []
    off: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny_gpt"
        shutil.copytree(REPO / "sample_projects" / "tiny_gpt", folder, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
        for i in range(args.rounds):
            for sample, into in ((False, off), (True, on)) if i % 2 == 0 else ((True, on), (False, off)):
                into.append(steps_per_second(folder / "train.py", args.steps, sample, args.hz, args.device))
    ratio = statistics.median(on) / statistics.median(off)
    from workbench.engine.memory.cgroup import read_ceiling
    from workbench.engine.memory.device import TorchNvmlProbe
    from workbench.engine.memory.sampler import take_sample

    probe = TorchNvmlProbe()
    per_sample = per_call(lambda: take_sample(probe))
    per_ceiling = per_call(read_ceiling)  # the memory cgroup's share of a sample (one pread; limits every 5 s)
    ceiling = read_ceiling()
    print(f"tiny_gpt on {args.device}, {args.rounds} rounds x {args.steps} steps each way, sampler at {args.hz:g} Hz")
    print(f"  sampler off: median {statistics.median(off):.2f} steps/s  {[round(x, 2) for x in off]}")
    print(f"  sampler on:  median {statistics.median(on):.2f} steps/s  {[round(x, 2) for x in on]}")
    print(f"  on / off: {ratio:.1%}  (target >= 99%)")
    print(f"  one sample costs {per_sample * 1e6:.0f} us: {per_sample * args.hz:.3%} of a core at {args.hz:g} Hz")
    print(
        f"  of which the memory ceiling {per_ceiling * 1e6:.1f} us ({ceiling.limit_source}, "
        f"{ceiling.limit_bytes / 2**30:.2f} GiB; limits re-read every 5 s)"
    )
    print(f"  {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
