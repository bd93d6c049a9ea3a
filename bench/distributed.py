"""Two ranks under torchrun (gloo on CPU): what vram-bench's lockstep costs, each figure beside its baseline.

- Steps/s of a 2-rank DDP MLP run by `vram-bench run --nproc-per-node 2 --headless` against the
  same model and loop under plain `torchrun` (no vram-bench), interleaved rounds, median ratio
  (target >= 98%). Both count steps/s between 20% and 100% of the steps from their own timestamps.
- Save -> applied: the time from writing the file to the `reload` event, 2 ranks against 1 process
  (`vram-bench run --headless`) on the same project, median of N saves each (target <= 1.5x).

    python bench/distributed.py [--rounds 5] [--steps 600] [--saves 10] [--exchange-ms 50]

`--exchange-ms` sets VRAM_BENCH_EXCHANGE_MS for the vram-bench runs: how far apart the ranks' control exchanges
are while training (shorter: a save applies sooner, at more CPU per second).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    LR = 0.01


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(64, 256)
            self.b = nn.Linear(256, 1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))


    def build(rank, ddp=True):
        torch.manual_seed(0)
        model = Net()
        if ddp:
            model = DDP(model)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=LR),
                "data": torch.Generator().manual_seed(rank)}


    def train_step(state):
        x = torch.randn(64, 64, generator=state["data"])
        loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        return loss
    """
)

UNDER_VRAM_BENCH = textwrap.dedent(
    """
    import sys
    from model import build, train_step


    def setup(bench):
        return build(bench.rank, ddp=bench.world_size > 1)


    def step(state, bench):
        return train_step(state)
    """
)

PLAIN = textwrap.dedent(
    """
    import os, sys, time, json
    import torch
    import torch.distributed as dist
    from model import build, train_step

    dist.init_process_group("gloo")
    state = build(dist.get_rank())
    steps = int(sys.argv[1])
    times = []
    for _ in range(steps):
        loss = train_step(state)
        float(loss)  # vram-bench reads the loss every step: the baseline does too
        times.append(time.time())
    if dist.get_rank() == 0:
        print(json.dumps(times))
    dist.barrier()  # without it gloo sometimes aborts (SIGABRT) a rank whose peer tore the group down first
    dist.destroy_process_group()
    """
)


def steps_per_second(times: list[float]) -> float:
    measured = times[len(times) // 5 :]
    return (len(measured) - 1) / (measured[-1] - measured[0])


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def plain_round(folder: Path, steps: int) -> float:
    done = torchrun(["plain.py", str(steps)], folder)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return steps_per_second(json.loads(done.stdout.strip().splitlines()[-1]))


def vram_bench_round(folder: Path, steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "run", "train.py", "--headless", "--nproc-per-node", "2", "--max-steps", str(steps),
         "--no-watch", "--no-gc-freeze"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    times = [e["time"] for e in map(json.loads, done.stdout.splitlines()) if e["event"] == "step" and e.get("rank") == 0]
    return steps_per_second(times)


def save_latencies(folder: Path, nproc: int, saves: int) -> list[float]:
    """Start a session, save `saves` edits to LR, read each reload's `ms` (change seen -> applied everywhere)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    extra = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", "train.py", "--headless", *extra], cwd=folder, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events: list[dict] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            event = json.loads(line)
            events.append(event)
            if event["event"] == "step" and event["step"] >= 50:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the session did not reach step 50")
        model = folder / "model.py"
        latencies = []
        for i in range(saves):
            before = sum(1 for e in events if e["event"] == "reload")
            text = model.read_text()
            model.write_text(text.replace(f"LR = {0.01 + i * 0.001:.3f}", f"LR = {0.01 + (i + 1) * 0.001:.3f}")
                             if i else text.replace("LR = 0.01", "LR = 0.011"))
            deadline = time.monotonic() + 30
            while sum(1 for e in events if e["event"] == "reload") == before:
                if time.monotonic() > deadline:
                    raise RuntimeError("no reload event")
                time.sleep(0.01)
            reload = [e for e in events if e["event"] == "reload"][-1]
            if not reload["ok"]:
                raise RuntimeError(reload)
            latencies.append(reload["ms"])
            time.sleep(0.3)
        return latencies
    finally:
        proc.stdin.write("quit\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        proc.wait(60)


def project(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    (folder / "train.py").write_text(UNDER_VRAM_BENCH)
    (folder / "plain.py").write_text(PLAIN)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 round of 100 steps, 2 saves (a smoke test)")
    parser.add_argument("--exchange-ms", type=float, default=None, help="VRAM_BENCH_EXCHANGE_MS for vram-bench's runs")
    args = parser.parse_args()
    if args.exchange_ms is not None:
        os.environ["VRAM_BENCH_EXCHANGE_MS"] = str(args.exchange_ms)
    if args.quick:
        args.rounds, args.steps, args.saves = 1, 100, 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = project(root, "throughput")
        ratios, plain, ours = [], [], []
        for i in range(args.rounds):
            order = (plain_round, vram_bench_round) if i % 2 == 0 else (vram_bench_round, plain_round)
            got = {fn.__name__: fn(folder, args.steps) for fn in order}
            plain.append(got["plain_round"])
            ours.append(got["vram_bench_round"])
            ratios.append(ours[-1] / plain[-1])
        one = save_latencies(project(root, "one"), 1, args.saves)
        two = save_latencies(project(root, "two"), 2, args.saves)
    exchange = os.environ.get("VRAM_BENCH_EXCHANGE_MS", "50 (default)")
    print(f"2-rank DDP MLP (64->256->1, batch 64, gloo), {args.rounds} interleaved rounds of {args.steps} steps; "
          f"exchanges every {exchange} ms")
    print(f"  plain torchrun: median {statistics.median(plain):.1f} steps/s  {[round(x, 1) for x in plain]}")
    print(f"  vram-bench:     median {statistics.median(ours):.1f} steps/s  {[round(x, 1) for x in ours]}")
    print(f"  vram-bench / plain: median of per-round ratios {statistics.median(ratios):.3f}  "
          f"{[round(x, 3) for x in ratios]}  (target >= 0.98)")
    print(f"save -> applied (reload event's ms), {args.saves} saves each")
    print(f"  1 process: median {statistics.median(one):.1f} ms  {[round(x, 1) for x in one]}")
    print(f"  2 ranks:   median {statistics.median(two):.1f} ms  {[round(x, 1) for x in two]}")
    print(f"  2 ranks / 1 process: {statistics.median(two) / statistics.median(one):.2f}x  (target <= 1.5x)")
    print(f"  {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
