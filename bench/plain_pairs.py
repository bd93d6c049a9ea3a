"""What one thing vram-bench adds to a process costs a plain 2-rank DDP loop: the loop against itself plus that thing.

To find where vram-bench's steps/s go without vram-bench in the way: two plain `torchrun` jobs of the loop of
bench/distributed.py, A and B, each with switches from the environment, measured as bench/distributed_pairs.py
measures (both loaded, SIGSTOP/SIGCONT in alternating 2 s windows). Reported: B / A, median of pairs and mean with
a 95 % interval. Switches:

    EXTRA_THREAD=1            train in a Python thread, the main thread waiting (as vram-bench's training thread)
    EXTRA_GLOO=1              an idle second gloo group (as vram-bench's control group had until 2026-11-28)
    EXTRA_GLOO=shared         the same, on the default group's gloo device (workbench/engine/control_group.py)
    EXTRA_PY_HZ=N EXTRA_WORK=K  one more Python thread waking N times a second for sum(range(K))
    EXTRA_NICE=N / EXTRA_IDLE=1   ... at nice N / under SCHED_IDLE (Linux)

    python bench/plain_pairs.py "EXTRA_THREAD=1" "EXTRA_THREAD=1 EXTRA_GLOO=1" --pairs 40
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from distributed import REPO, project  # bench/ is this script's folder, hence on sys.path
from distributed_pairs import Job, wait_for, window_rate

LOOP = '''
import os, signal, sys, threading, time
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from model import build, train_step

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below writes the times
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("EXTRA_GLOO") == "shared":
    sys.path.insert(0, os.environ["REPO"])
    from workbench.engine.control_group import new_control_group
    extra = new_control_group(c10d.default_pg_timeout)
elif os.environ.get("EXTRA_GLOO"):
    extra = dist.new_group(backend="gloo")
if float(os.environ.get("EXTRA_PY_HZ", 0)):
    def tick(period=1 / float(os.environ["EXTRA_PY_HZ"]), work=int(os.environ.get("EXTRA_WORK", 10))):
        if os.environ.get("EXTRA_NICE"):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(os.environ["EXTRA_NICE"]))
        if os.environ.get("EXTRA_IDLE"):
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        while True:
            time.sleep(period)
            sum(range(work))
    threading.Thread(target=tick, daemon=True).start()
times = []

def loop():
    state = build(rank)
    while True:
        float(train_step(state))  # vram-bench reads the loss every step: so does this loop
        times.append(time.time())
        if len(times) == 100 and rank == 0:
            open("plain-ready", "w").close()

try:
    if os.environ.get("EXTRA_THREAD"):
        threading.Thread(target=loop, daemon=True).start()
        while True:
            time.sleep(3600)
    loop()
finally:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun passes the benchmark's SIGTERM on: a second one
    if rank == 0:
        with open("plain-times.json", "w") as out:
            out.write(",".join(map(repr, times)))
    os._exit(0)
'''


def switches(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help='job A\'s switches, e.g. "" or "EXTRA_THREAD=1"')
    parser.add_argument("b", help="job B's switches")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = [project(Path(tmp), "a"), project(Path(tmp), "b")]
        env = {**os.environ, "PYTHONPATH": str(REPO), "REPO": str(REPO)}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "loop.py"]
        jobs = []
        for name, folder, words in zip("ab", folders, (args.a, args.b)):
            (folder / "loop.py").write_text(LOOP)
            jobs.append(Job(name, torchrun, folder, {**env, **switches(words)}))
        windows = []
        try:
            for folder in folders:
                wait_for(lambda: (folder / "plain-ready").exists(), "the 100th step")
            for job in jobs:
                job.signal(signal.SIGSTOP)
            for i in range(args.pairs):
                for job in jobs if i % 2 == 0 else jobs[::-1]:
                    job.signal(signal.SIGCONT)
                    time.sleep(args.settle)
                    start = time.time()
                    time.sleep(args.window)
                    windows.append((job.name, start, time.time()))
                    job.signal(signal.SIGSTOP)
        finally:
            for job in jobs:
                job.signal(signal.SIGCONT)
                job.signal(signal.SIGTERM)
            for job in jobs:
                job.proc.wait(60)
        times = {name: [float(t) for t in (folder / "plain-times.json").read_text().split(",")]
                 for name, folder in zip("ab", folders)}
    rates: dict[str, list[float]] = {"a": [], "b": []}
    for name, start, end in windows:
        rates[name].append(window_rate(times[name], start, end))
    ratios = [b / a for a, b in zip(rates["a"], rates["b"])]
    mean = statistics.fmean(ratios)
    half = 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
    print(f"A {args.a!r}: median {statistics.median(rates['a']):.1f} steps/s; B {args.b!r}: median "
          f"{statistics.median(rates['b']):.1f} steps/s ({len(ratios)} pairs of {args.window:g} s windows)")
    print(f"  B / A: median of pairs {statistics.median(ratios):.3f}; mean {mean:.3f} (95 % interval "
          f"{mean - half:.3f}-{mean + half:.3f})")


if __name__ == "__main__":
    main()
