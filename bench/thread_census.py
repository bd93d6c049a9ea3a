"""Where a 2-rank job's CPU goes, thread by thread, per training step: plain torchrun against vram-bench.

Steps/s on a shared 2-core VM moves +-15 % from one run to the next; CPU time per step, split by thread, moves far
less and says which thread a cost is on. Each job (the loop of bench/distributed.py) runs alone; after a warm-up,
every thread's CPU time (from /proc) is read at both ends of a window, and the steps rank 0 trained in it are counted.
Python threads are grouped as the training thread (the busiest one), the main thread, and the others (vram-bench's
helpers: the event log, the memory sampler, the watchdogs); gloo's and torch's threads by their names.

    python bench/thread_census.py [--window 20] [--rounds 2] [--model small]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from distributed import (  # bench/ is this script's folder, hence on sys.path
    MODELS,
    REPO,
    project,
)
from distributed_pairs import PLAIN_FOREVER, Job, vram_bench_job

TICK = os.sysconf("SC_CLK_TCK")


def thread_times(job: Job) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (group, CPU seconds so far) for every thread of every process of the job."""
    found = {}
    for process in job.processes():
        try:
            tids = os.listdir(f"/proc/{process.pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{process.pid}/task/{tid}/stat").read_text()
                name = Path(f"/proc/{process.pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            found[(process.pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return found


def census(kind: str, root: Path, model: str, window: float, env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """(rank 0's steps/s, CPU microseconds a step by thread group, both ranks together) over one window."""
    folder = project(root, f"{kind}-{time.monotonic_ns()}", model)
    if kind == "plain":
        (folder / "forever.py").write_text(PLAIN_FOREVER)
        job = Job(kind, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "forever.py"], folder, env)
        events = None
    else:
        job, events = vram_bench_job(kind, folder, env, [])
    try:
        time.sleep(12)  # start-up and warm-up
        before, start = thread_times(job), time.time()
        time.sleep(window)
        after, end = thread_times(job), time.time()
    finally:
        job.signal(signal.SIGTERM)
        try:
            job.proc.wait(60)
        except Exception:  # noqa: BLE001 - a job that will not stop is killed; its figures are already read
            job.signal(signal.SIGKILL)
        if events is not None:
            events.close()
    if kind == "plain":
        times = [float(t) for t in (folder / "plain-times.json").read_text().split(",")]
    else:
        times = [e["time"] for e in map(json.loads, (folder / "events.out").read_text().splitlines())
                 if e["event"] == "step" and e.get("rank") == 0]
    steps = sum(1 for t in times if start <= t <= end)
    used = {key: (name, seconds - before.get(key, (name, 0.0))[1]) for key, (name, seconds) in after.items()}
    busiest = {pid: max((s, tid) for (p, tid), (n, s) in used.items() if p == pid and n == "python")[1]
               for pid in {p for p, _ in used}
               if any(p == pid and n == "python" for (p, _), (n, _) in used.items())}
    groups: dict[str, float] = collections.defaultdict(float)
    for (pid, tid), (name, seconds) in used.items():
        if name == "python":
            name = ("python: training" if busiest.get(pid) == tid and seconds > 0.1 * window
                    else "python: main" if pid == tid else "python: other")
        groups[name] += seconds
    return steps / (end - start), {name: seconds / steps * 1e6 for name, seconds in groups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, dict[str, float]]]] = {"plain": [], "vram-bench": []}
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Path(tmp) / "runtime"
        runtime.mkdir(mode=0o700)
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(runtime)}
        for _ in range(args.rounds):
            for kind, runs in results.items():
                runs.append(census(kind, Path(tmp), args.model, args.window, env))
                rate, groups = runs[-1]
                print(f"  {kind}: {rate:.0f} steps/s; " + ", ".join(f"{n} {us:.1f}" for n, us in sorted(groups.items())
                                                                     if us >= 0.5) + " us CPU a step", flush=True)
    widths, batch = MODELS[args.model]
    print(f"2-rank DDP MLP ({' -> '.join(map(str, widths))}, batch {batch}, gloo), {args.rounds} rounds of {args.window:g} s; "
          "CPU microseconds a step, both ranks together (mean of rounds):")
    names = sorted({n for runs in results.values() for _, groups in runs for n in groups})
    for name in names:
        row = {kind: sum(g.get(name, 0.0) for _, g in runs) / len(runs) for kind, runs in results.items()}
        if max(row.values()) >= 0.5:
            print(f"  {name:18} plain {row['plain']:8.1f}   vram-bench {row['vram-bench']:8.1f}")
    print(f"  {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
