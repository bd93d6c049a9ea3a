"""Steps/s of 2 ranks under vram-bench against plain torchrun, as many short pairs of windows.

bench/distributed.py interleaves whole runs: a few rounds, each a fresh start, and on a shared VM the
rounds move +-15 % with the machine, far more than the 2 % being measured. Here both jobs start once and
stay loaded: the same 2-rank DDP loop under plain `torchrun`, and under `vram-bench run --nproc-per-node 2
--headless`. Every process of one job is stopped (SIGSTOP) while the other runs, and the two take turns
in short windows (order alternating pair by pair), so a pair's two windows see the same machine a few
seconds apart. Each window starts after a settle time (caches and gloo's sockets warm again after
SIGCONT) and counts rank 0's steps between its ends, from the steps' own timestamps. Reported: the median
of the pairs' ratios, and their mean with a 95 % interval; the target is >= 0.98.

    python bench/distributed_pairs.py [--model small] [--pairs 60] [--window 2] [--settle 0.5]
    python bench/distributed_pairs.py --pairs 30 --against "VRAM_BENCH_EXCHANGE_MS=5000"   # two settings, one run
    python bench/distributed_pairs.py --pairs 40 --against "" --train-steps-per-step 4  # the per-step path's cost

The jobs are the project of bench/distributed.py (`project`, `MODELS`), so the two benchmarks measure the
same loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import torch

from distributed import MODELS, REPO, project  # bench/ is this script's folder, hence on sys.path

PLAIN_FOREVER = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch.distributed as dist
    from model import build, train_step

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below writes the times
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = build(rank)
    times = []
    try:
        while True:
            loss = train_step(state)
            float(loss)  # vram-bench reads the loss every step: the baseline does too
            times.append(time.time())
            if len(times) == 100 and rank == 0:
                open("plain-ready", "w").close()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun passes the benchmark's SIGTERM on: a second one
        if rank == 0:
            with open("plain-times.json", "w") as out:
                out.write(",".join(map(repr, times)))
        os._exit(0)
    """
)


class Job:
    """One 2-rank job: its launcher and every process under it, stopped and continued together."""

    def __init__(self, name: str, args: list[str], folder: Path, env: dict[str, str], stdout=None) -> None:
        self.name = name
        self.proc = subprocess.Popen(args, cwd=folder, env=env, stdin=subprocess.PIPE, stdout=stdout or subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]  # torchrun starts each rank in a session of its own

    def cpu_seconds(self) -> float:
        total = 0.0
        for process in self.processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def signal(self, sig: signal.Signals) -> None:
        for process in self.processes():
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass


def wait_for(check, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def window_rate(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    if len(inside) < 3:
        raise RuntimeError(f"only {len(inside)} steps in a window: make --window longer")
    return (len(inside) - 1) / (inside[-1] - inside[0])


def vram_bench_job(name: str, folder: Path, env: dict[str, str], options: list[str]) -> tuple[Job, object]:
    """A 2-rank vram-bench job writing its events to `folder/events.out` (and that file, to close at the end)."""
    events = (folder / "events.out").open("w")
    job = Job(name, [sys.executable, "-m", "workbench", "run", "train.py", "--headless", "--nproc-per-node", "2",
                     "--no-watch", *options], folder, env, stdout=events)
    return job, events


def rank_0_step_times(folder: Path) -> list[float]:
    return [e["time"] for e in map(json.loads, (folder / "events.out").read_text().splitlines())
            if e["event"] == "step" and e.get("rank") == 0]


def split_against(text: str) -> tuple[dict[str, str], list[str]]:
    """`--against`'s words: NAME=VALUE ones are environment, the rest vram-bench's options."""
    words = text.split()
    env = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    return env, [word for word in words if not ("=" in word and not word.startswith("-"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--window", type=float, default=None, help="seconds a window (default: 2 small, 6 medium)")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds after SIGCONT before a window starts")
    parser.add_argument("--ours-args", default="", help="more options for vram-bench's job (to find what a cost comes from, "
                        "e.g. \"--sample-hz 1\")")
    parser.add_argument("--train-steps-per-step", type=int, default=1, metavar="K",
                        help="vram-bench's job trains K steps of the loop per vram-bench step (its rate counts all K): "
                        "what vram-bench's per-step path costs, found by doing it K times less often")
    parser.add_argument("--against", default=None, help="the baseline is vram-bench run otherwise, not plain torchrun: "
                        "NAME=VALUE environment and options, e.g. \"VRAM_BENCH_EXCHANGE_MS=5000\" (two settings in one run)")
    args = parser.parse_args()
    window = args.window or {"small": 2.0, "issue": 2.0, "mid": 3.0}.get(args.model, 6.0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain_dir, ours_dir = project(root, "plain", args.model), project(root, "ours", args.model)
        (plain_dir / "forever.py").write_text(PLAIN_FOREVER)
        runtime = root / "runtime"  # the session's socket and registry entry, away from the user's own sessions
        runtime.mkdir(mode=0o700)
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(runtime)}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        files = []
        if args.against is None:
            plain = Job("plain", [*torchrun, "forever.py"], plain_dir, env)
        else:
            extra_env, options = split_against(args.against)
            plain, baseline_events = vram_bench_job("plain", plain_dir, {**env, **extra_env}, options)
            files.append(baseline_events)
        ours_env = {**env, "BENCH_TRAIN_STEPS_PER_STEP": str(args.train_steps_per_step)}
        ours, events = vram_bench_job("vram-bench", ours_dir, ours_env, args.ours_args.split())
        files.append(events)
        windows: list[tuple[str, float, float]] = []
        leaked: list[float] = []
        try:
            if args.against is None:
                wait_for(lambda: (plain_dir / "plain-ready").exists(), "the plain job's 100th step")
            else:
                wait_for(lambda: '"step":100,' in (plain_dir / "events.out").read_text(), "the baseline's 100th step")
            wait_for(lambda: '"step":100,' in (ours_dir / "events.out").read_text(), "vram-bench's 100th step")
            plain.signal(signal.SIGSTOP)
            ours.signal(signal.SIGSTOP)
            for i in range(args.pairs):
                for job in (plain, ours) if i % 2 == 0 else (ours, plain):
                    other = ours if job is plain else plain
                    other_cpu = other.cpu_seconds()
                    job.signal(signal.SIGCONT)
                    time.sleep(args.settle)
                    start = time.time()
                    time.sleep(window)
                    end = time.time()
                    job.signal(signal.SIGSTOP)
                    windows.append((job.name, start, end))
                    leaked.append(other.cpu_seconds() - other_cpu)  # a stopped job uses none: checked, not assumed
        finally:
            for job in (plain, ours):
                job.signal(signal.SIGCONT)
            if args.against is None:
                plain.signal(signal.SIGTERM)
            for job in (plain, ours) if args.against is not None else (ours,):
                job.proc.stdin.write("quit\n")  # type: ignore[union-attr]
                job.proc.stdin.flush()  # type: ignore[union-attr]
            for job in (plain, ours):
                try:
                    job.proc.wait(120)
                except subprocess.TimeoutExpired:
                    job.signal(signal.SIGKILL)
            for file in files:
                file.close()
        plain_times = ([float(t) for t in (plain_dir / "plain-times.json").read_text().split(",")] if args.against is None
                       else rank_0_step_times(plain_dir))
        our_times = rank_0_step_times(ours_dir)
    rates = {"plain": [], "vram-bench": []}
    for name, start, end in windows:
        rates[name].append(window_rate(plain_times if name == "plain" else our_times, start, end)
                           * (1 if name == "plain" else args.train_steps_per_step))
    ratios = [ours / plain for plain, ours in zip(rates["plain"], rates["vram-bench"])]
    mean = statistics.fmean(ratios)
    half = 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
    widths, batch = MODELS[args.model]
    print(f"2-rank DDP MLP ({' -> '.join(map(str, widths))}, batch {batch}, gloo): {len(ratios)} pairs of {window:g} s windows, "
          f"{args.settle:g} s settle, both jobs loaded throughout")
    baseline = "plain torchrun" if args.against is None else f"vram-bench with {args.against}"
    print(f"  {baseline}: median {statistics.median(rates['plain']):.1f} steps/s "
          f"(windows {min(rates['plain']):.1f}-{max(rates['plain']):.1f})")
    k = f" ({args.train_steps_per_step} training steps a step)" if args.train_steps_per_step > 1 else ""
    print(f"  vram-bench{(' ' + args.ours_args) if args.ours_args else ''}{k}: median {statistics.median(rates['vram-bench']):.1f} steps/s "
          f"(windows {min(rates['vram-bench']):.1f}-{max(rates['vram-bench']):.1f})")
    print(f"  vram-bench / {'plain' if args.against is None else 'baseline'}: median of pairs {statistics.median(ratios):.3f}; mean {mean:.3f} "
          f"(95 % interval {mean - half:.3f}-{mean + half:.3f}); target >= 0.98")
    print(f"  pairs: {[round(r, 3) for r in ratios]}")
    print(f"  CPU the stopped job used during the other's windows: at most {max(leaked) * 1000:.0f} ms a window")
    print(f"  {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
