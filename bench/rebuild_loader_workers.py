"""How long a rebuild takes when the state's batches come from a DataLoader with workers, against none.

Found porting pytorch/examples' imagenet trainer with `-j 1`: every rebuild took 10.2 s, against 0.16 s with
`-j 0`. Its state is a reference cycle (`state["batches"] = epochs(state)`), and a DataLoader iterator freed by
the garbage collector with its queues waits out torch's 5 s for workers that never hear their final message.
A rebuild now closes the old generators first (workbench/engine/released_iterators.py).

The project (written to a temp folder): a small CNN on random 3x32x32 images, `epochs(state)` a generator over
a DataLoader with `--workers N`; `vram-bench run train.py --headless` takes `rebuild` on stdin every 1.5 s. The
figure: the median of the `rebuild` events' `seconds` with 1 worker, as x the same with 0 (the baseline, same
run), and the worker processes left after the last rebuild.

    python bench/rebuild_loader_workers.py [--rebuilds 5]
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
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

TRAIN_PY = """\
import sys

import torch
from torch import nn

WORKERS = int(sys.argv[1])


class Images(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=g), index % 10


def epochs(state):
    for epoch in range(1000):
        for images, target in state["loader"]:
            yield images, target


def setup(bench):
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(16 * 16 * 16, 10))
    loader = torch.utils.data.DataLoader(Images(), batch_size=32, shuffle=True, num_workers=WORKERS)
    state = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "loader": loader}
    state["batches"] = epochs(state)
    return state


def step(state, bench):
    images, target = next(state["batches"])
    loss = nn.functional.cross_entropy(state["model"](images), target)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def measure(workers: int, rebuilds: int, folder: Path) -> tuple[list[float], int]:
    """The `seconds` of each rebuild, and the session's child processes after the last one."""
    (folder / "train.py").write_text(TRAIN_PY)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", "train.py", "--headless", "--no-watch", "--", str(workers)],
        cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdin is not None and process.stdout is not None
    seconds: list[float] = []
    try:
        for line in process.stdout:
            event = json.loads(line)
            if event["event"] == "step" and event["step"] == 20 and not seconds:
                process.stdin.write("rebuild\n")
                process.stdin.flush()
            elif event["event"] == "rebuild":
                if not event["ok"]:
                    raise SystemExit(f"rebuild failed: {event['error']}")
                seconds.append(event["seconds"])
                if len(seconds) == rebuilds:
                    break
                time.sleep(1.5)
                process.stdin.write("rebuild\n")
                process.stdin.flush()
        time.sleep(1.0)
        children = len(psutil.Process(process.pid).children())
        process.stdin.write("quit\n")
        process.stdin.flush()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return seconds, children


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuilds", type=int, default=5)
    options = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (0, 1):
            folder = Path(tmp) / f"w{workers}"
            folder.mkdir()
            results[workers] = measure(workers, options.rebuilds, folder)
    base, with_workers = (statistics.median(results[w][0]) for w in (0, 1))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for workers, (seconds, children) in results.items():
        shown = ", ".join(f"{s:.3f}" for s in seconds)
        print(f"workers={workers}: rebuild seconds {shown} (median {statistics.median(seconds):.3f}); "
              f"child processes after the last rebuild: {children}")
    print(f"rebuild with 1 worker / with none: {with_workers / base:.2f}x")


if __name__ == "__main__":
    main()
