"""What a late client's history costs: 100,000 steps as JSON lines versus the columnar replay.

A client that attaches after hours must draw the same screen. Three ways to send it
the steps (each step: loss and two scalars, `lr` and `grad_norm`):

  (a) one `step` event per step, as JSON lines: Event.to_json() on the session,
      event_from_json() on the client;
  (b) build_history(full=True): every point, in columns;
  (c) build_history(max_points=2000): what the chart draws.

(b) and (c) also carry 300 s of memory samples at 10 Hz with one GPU (the gauges'
history), the versions table and the step times; the memory part is shown on its
own line. Times are the best of --repeat runs; encode = build + json.dumps on the
session side, decode = json.loads + TelemetryMirror.load_history on the client.

    python bench/replay_history.py                  # 100,000 steps, 5 repeats
    python bench/replay_history.py --steps 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.protocol.events import Step, event_from_json  # noqa: E402
from workbench.engine.memory.device import GpuMemory  # noqa: E402
from workbench.engine.memory.host import HostMemory  # noqa: E402
from workbench.engine.memory.sampler import MemorySample  # noqa: E402
from workbench.protocol.history import build_history, memory_columns  # noqa: E402
from workbench.protocol.mirror import TelemetryMirror  # noqa: E402
from workbench.engine.telemetry import Telemetry  # noqa: E402

GiB = 1024**3


def best_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """The fastest of `repeat` runs (the machine is shared: the best run is the one least disturbed)."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def make_steps(n: int) -> list[Step]:
    now = time.time()
    return [
        Step(step=i, loss=4.0 / (1 + i * 1e-3), ms=41.7 + i % 9, scalars={"lr": 3e-4 * (1 - i / n), "grad_norm": 0.5 + (i % 13) / 7},
             code_version=i * 5 // n, time=now - (n - i) * 0.04)
        for i in range(1, n + 1)
    ]


def make_telemetry(steps: list[Step], memory_samples: int) -> Telemetry:
    telemetry = Telemetry(points=len(steps), memory_history=memory_samples)
    version = 0
    for event in steps:
        if event.code_version != version:
            version = event.code_version
            telemetry.record_version(event.step - 1, version, ("step",))
        telemetry.record_step(event.step, {"loss": event.loss, **event.scalars}, event.ms)
        telemetry.versions.record_step(event.ms, event.loss, event.scalars, 3 * GiB)
    now = time.time()
    for i in range(memory_samples):
        host = HostMemory(rss=6 * GiB + i, rss_anon=5 * GiB, rss_file=GiB, system_total=128 * GiB,
                          system_available=90 * GiB, swap_used=0)
        gpu = GpuMemory(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-1234", allocated=30 * GiB + i * 4096,
                        reserved=40 * GiB, peak_allocated=38 * GiB, inactive_split=GiB, alloc_retries=0, ooms=0,
                        allocations=i * 900, device_used=42 * GiB, device_total=80 * GiB, limit=80 * GiB,
                        limit_source="device", process_used=41 * GiB, utilization=97, temperature=61, power_watts=612.5)
        telemetry.store_memory(MemorySample(now - (memory_samples - i) * 0.1, host, (gpu,), None, (850.0,)))
    return telemetry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--memory-samples", type=int, default=3000, help="300 s at 10 Hz")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    steps = make_steps(args.steps)
    telemetry = make_telemetry(steps, args.memory_samples)
    rows: list[tuple[str, float, float, int]] = []

    encode_s, lines = best_seconds(lambda: [e.to_json() for e in steps], args.repeat)
    decode_s, _ = best_seconds(lambda: [event_from_json(line) for line in lines], args.repeat)
    loads_s, _ = best_seconds(lambda: [json.loads(line) for line in lines], args.repeat)
    rows.append(("(a) JSON lines", encode_s, decode_s, sum(len(line) + 1 for line in lines)))

    for label, kwargs in (("(b) columnar, full", {"full": True}), ("(c) columnar, 2,000 points", {"max_points": 2000})):
        encode_s, text = best_seconds(
            lambda kw=kwargs: json.dumps(build_history(telemetry, memory_seconds=300, **kw), allow_nan=False, separators=(",", ":")),
            args.repeat,
        )

        def load(text: str = text) -> TelemetryMirror:
            mirror = TelemetryMirror(points=args.steps)
            mirror.load_history(json.loads(text))
            return mirror

        decode_s, mirror = best_seconds(load, args.repeat)
        assert mirror.series()[0].steps[-1] == args.steps
        rows.append((label, encode_s, decode_s, len(text)))

    memory_text = json.dumps(memory_columns(telemetry.memory_history(300), 300), separators=(",", ":"))

    print(f"{args.steps:,} steps (loss + 2 scalars); {args.memory_samples:,} memory samples, 1 GPU; "
          f"best of {args.repeat}; Python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    base = rows[0]
    print(f"{'':28} {'encode ms':>10} {'decode ms':>10} {'bytes':>12} {'time vs (a)':>12} {'bytes vs (a)':>13}")
    for label, enc, dec, size in rows:
        print(f"{label:28} {enc * 1000:10.1f} {dec * 1000:10.1f} {size:12,} "
              f"{(enc + dec) / (base[1] + base[2]):12.3f} {size / base[3]:13.4f}")
    print(f"(a) decode, json.loads alone: {loads_s * 1000:.1f} ms (event_from_json adds {(base[2] - loads_s) * 1000:.1f} ms)")
    print(f"memory history inside (b) and (c): {len(memory_text):,} bytes")


if __name__ == "__main__":
    main()
