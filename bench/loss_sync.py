"""What reading the loss every step costs on a GPU: a plain loop that never waits for the GPU, the same loop with
`loss.item()` every step (what vram-bench did to show the loss until it read it a step late), and the same model under
`vram-bench run --headless`, which copies the loss off the GPU without waiting (workbench/engine/step_values.py).

On a GPU, `.item()` waits for the step's kernels: the CPU cannot queue the next step while the GPU runs this one, so
the GPU idles for whatever Python runs between two steps plus a kernel launch. That is negligible for long steps and
could be several percent for GPU-bound steps of a few ms. vram-bench should now be as fast as the loop that never
waits. On a CPU the three are the same work (a baseline for the script itself, not a finding).

    python bench/loss_sync.py [--device cuda] [--rounds 5] [--steps 2000] [--width 2048] [--depth 4] [--batch 256]

Interleaved rounds; each figure is the median steps/s between 20 % and 100 % of a round's steps, and the ratios are
medians of per-round ratios against the loop that never waits.
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

import torch

REPO = Path(__file__).resolve().parents[1]

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build(width, depth, device):
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(width, 1)).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


    def one_step(model, opt, x):
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    """
)

UNDER_VRAM_BENCH = textwrap.dedent(
    """
    import os

    import torch

    from model import build, one_step

    WIDTH, DEPTH, BATCH = (int(v) for v in os.environ["LOSS_SYNC_SHAPE"].split(","))


    def setup(bench):
        model, opt = build(WIDTH, DEPTH, bench.device)
        return {"model": model, "opt": opt, "x": torch.randn(BATCH, WIDTH, device=bench.device)}


    def step(state, bench):
        return one_step(state["model"], state["opt"], state["x"])
    """
)


def plain_round(folder: Path, device: str, shape: tuple[int, int, int], steps: int, sync_every_step: bool) -> float:
    """Steps/s of the plain loop in this process (the model is built afresh each round)."""
    sys.path.insert(0, str(folder))
    try:
        from model import build, one_step  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    width, depth, batch = shape
    model, opt = build(width, depth, torch.device(device))
    x = torch.randn(batch, width, device=device)
    times = []
    for i in range(steps):
        loss = one_step(model, opt, x)
        if sync_every_step:
            loss.item()
        elif i % 100 == 99:  # a loop that logs now and then: the GPU runs ahead between
            loss.item()
        times.append(time.perf_counter())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    times[-1] = time.perf_counter()
    first = steps // 5
    return (steps - 1 - first) / (times[-1] - times[first])


def vram_bench_round(folder: Path, device: str, shape: tuple[int, int, int], steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOSS_SYNC_SHAPE": ",".join(map(str, shape))}
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "run", "train.py", "--headless", "--no-watch", "--device", device,
         "--max-steps", str(steps)],
        cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    stamps = [(e["step"], e["time"]) for e in map(json.loads, done.stdout.splitlines()) if e["event"] == "step"]
    (s0, t0), (s1, t1) = stamps[len(stamps) // 5], stamps[-1]
    return (s1 - s0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    shape = (args.width, args.depth, args.batch)
    runs: dict[str, list[float]] = {"never waits": [], "item() every step": [], "vram-bench": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "model.py").write_text(MODEL)
        (folder / "train.py").write_text(UNDER_VRAM_BENCH)
        for i in range(args.rounds):
            got = {
                "never waits": plain_round(folder, args.device, shape, args.steps, sync_every_step=False),
                "item() every step": plain_round(folder, args.device, shape, args.steps, sync_every_step=True),
                "vram-bench": vram_bench_round(folder, args.device, shape, args.steps),
            }
            for name, rate in got.items():
                runs[name].append(rate)
            print(f"  round {i + 1}: " + ", ".join(f"{name} {rate:.1f}" for name, rate in got.items()) + " steps/s",
                  flush=True)
    base = runs["never waits"]
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"{os.cpu_count()} CPU cores"
    print(f"MLP {args.width}x{args.depth}, batch {args.batch}, AdamW, on {args.device} ({name}), {args.rounds} rounds of "
          f"{args.steps} steps; torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}")
    for label, rates in runs.items():
        ratio = statistics.median(r / b for r, b in zip(rates, base))
        print(f"  {label:18} median {statistics.median(rates):8.1f} steps/s  ({ratio:.3f} of the loop that never waits)"
              f"  {[round(r, 1) for r in rates]}")


if __name__ == "__main__":
    main()
