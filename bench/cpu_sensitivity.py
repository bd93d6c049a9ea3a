"""How much a 2-rank gloo run on this machine slows when something else takes a little CPU (no vram-bench).

Why: under torchrun, vram-bench's small-model steps/s ratio (bench/distributed.py) sits near 0.85-0.90 while
its extra CPU is a few per cent of a core. This measures the machine, not vram-bench: the same plain
`torchrun` loop as bench/distributed.py's baseline (a 64 -> 256 -> 1 DDP MLP, batch 64, gloo), with a
side job that JSON-encodes step-like dicts in bursts, either in a thread of rank 0 and rank 1 (it then
competes for the GIL too) or in a separate process per rank (CPU only, no GIL). Interleaved rounds,
steps/s counted inside each rank between steps 2,000 and 12,000, rank 0's figure.

    python bench/cpu_sensitivity.py [--rounds 4] [--period 0.05] [--burst 70]

`--burst` JSON-encoded step events every `--period` seconds (the script prints the share of a core that is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from distributed import MODEL, MODELS  # noqa: E402  (the same model as the baseline there)

LOOP = textwrap.dedent(
    """
    import os, sys, time, threading
    import torch.distributed as dist
    from model import build, train_step
    import json

    SIDE = os.environ["SIDE"]  # none | thread | process
    PERIOD, BURST = float(os.environ["PERIOD"]), int(os.environ["BURST"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = build(rank)
    times = []
    done = False


    def side_job(parent):
        while not done and (parent is None or os.getppid() == parent):
            time.sleep(PERIOD)
            for _ in range(BURST):
                json.dumps({"event": "step", "time": time.time(), "step": len(times), "loss": 0.1, "ms": 1.2,
                            "scalars": {}, "code_version": 0, "rank": rank}, separators=(",", ":"))


    if SIDE == "thread":
        threading.Thread(target=side_job, args=(None,), daemon=True).start()
    elif SIDE == "process":
        import multiprocessing
        multiprocessing.get_context("fork").Process(target=side_job, args=(os.getpid(),), daemon=True).start()
    for _ in range(12000):
        train_step(state).item()
        times.append(time.perf_counter())
    if rank == 0:
        print("RATE", 10000 / (times[-1] - times[2000]), flush=True)
    done = True
    dist.barrier()
    os._exit(0)
    """
)


def run(folder: Path, side: str, period: float, burst: int) -> float:
    env = {**os.environ, "SIDE": side, "PERIOD": str(period), "BURST": str(burst), "REPO": str(REPO),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "loop.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith("RATE"):
            return float(line.split()[1])
    raise RuntimeError(done.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--period", type=float, default=0.05)
    parser.add_argument("--burst", type=int, default=150)
    args = parser.parse_args()
    started = time.perf_counter()
    for i in range(args.burst * 200):
        json.dumps({"event": "step", "time": time.time(), "step": i, "loss": 0.1, "ms": 1.2, "scalars": {},
                    "code_version": 0, "rank": 0}, separators=(",", ":"))
    burst_ms = (time.perf_counter() - started) / 200 * 1000
    print(f"side job: {args.burst} events in {burst_ms:.2f} ms (alone) every {args.period * 1000:.0f} ms, "
          f"{burst_ms / (args.period * 1000) * 100:.1f} % of a core", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        widths, batch = MODELS["small"]
        (folder / "model.py").write_text(MODEL.replace("__WIDTHS__", repr(widths)).replace("__BATCH__", str(batch)))
        (folder / "loop.py").write_text(LOOP)
        rates: dict[str, list[float]] = {"none": [], "thread": [], "process": []}
        for i in range(args.rounds):
            for side in rates:
                rates[side].append(run(folder, side, args.period, args.burst))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()), flush=True)
    base = statistics.median(rates["none"])
    for side in ("thread", "process"):
        ratios = [r / n for r, n in zip(rates[side], rates["none"])]
        print(f"{side}: median {statistics.median(rates[side]):.1f} steps/s against {base:.1f} with nothing beside; "
              f"median per-round ratio {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
