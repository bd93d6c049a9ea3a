"""What a resume's setup() costs when it draws at random after building its model.

A resume runs setup() with parameter initialization skipped (workbench/engine/init_skipping.py), except that a draw
setup() makes after its model makes the skipped initialization run first, so the draw is a fresh start's. This
measures that price on one project in two versions, its data drawn before the model or after it:

- fresh: `vram-bench run train.py --headless` with no resume (initialization runs: the baseline);
- resumed, data before the model: initialization skipped;
- resumed, data after the model: the skipped initialization runs at the draw (the resume's notes say so).

Each figure is the median of `--repeat` runs of setup() alone (the `setup` event's seconds), each run a fresh
process; the model is `--layers` x `Linear(--width, --width)`.

    python bench/resume_draws.py [--layers 12] [--width 2048] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

PROJECT = """\
import torch

LAYERS, WIDTH = {layers}, {width}


def setup(bench):
    torch.manual_seed(0)
{first}
{second}
    return {{"model": model, "opt": torch.optim.SGD(model.parameters(), lr=1e-3), "x": x}}


def step(state, bench):
    loss = state["model"](state["x"][:8]).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""
MODEL = "    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])"
DATA = "    x = torch.randn(64, WIDTH)"


def events(entry: Path, *args: str, commands: str = "") -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "workbench", "run", entry.name, "--headless", "--device", "cpu", *args],
                          cwd=entry.parent, input=commands, capture_output=True, text=True, timeout=600)
    found = []
    for line in done.stdout.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def setup_seconds(found: list[dict]) -> float:
    return next(e["seconds"] for e in found if e["event"] == "setup" and e.get("status") == "done")


def snapshot_of(entry: Path) -> str:
    """A snapshot after one step: a paused start, each command sent once the last one's event is out."""
    process = subprocess.Popen([sys.executable, "-m", "workbench", "run", entry.name, "--headless", "--device", "cpu",
                                "--paused"], cwd=entry.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    path = None
    for command, answer in (("step", "step"), ("snapshot", "snapshot")):
        process.stdin.write(command + "\n")
        process.stdin.flush()
        for line in process.stdout:
            if line.startswith(f'{{"event":"{answer}"'):
                path = json.loads(line).get("path")
                break
    process.stdin.write("quit\n")
    process.stdin.close()
    process.wait(timeout=120)
    assert path is not None, "no snapshot was written"
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        entries = {}
        for name, (first, second) in {"before": (DATA, MODEL), "after": (MODEL, DATA)}.items():
            folder = Path(tmp) / name
            folder.mkdir()
            entries[name] = folder / "train.py"
            entries[name].write_text(PROJECT.format(layers=args.layers, width=args.width, first=first, second=second))
        snapshots = {name: snapshot_of(entry) for name, entry in entries.items()}
        seconds: dict[str, list[float]] = {"fresh": [], "before": [], "after": []}
        notes: list[str] = []
        for _ in range(args.repeat):
            seconds["fresh"].append(setup_seconds(events(entries["after"], "--max-steps", "1")))
            for name, entry in entries.items():
                found = events(entry, "--resume", snapshots[name], "--max-steps", "2")
                seconds[name].append(setup_seconds(found))
                resumed = next(e for e in found if e["event"] == "resume")
                assert resumed["ok"], resumed
                notes = [n for n in resumed["notes"] if "random generator" in n] if name == "after" else notes
    parameters = args.layers * (args.width * args.width + args.width)
    fresh = statistics.median(seconds["fresh"])
    print(f"{args.layers} x Linear({args.width}, {args.width}): {parameters / 1e6:.1f}M parameters, "
          f"{parameters * 4 / 2**20:.0f} MiB; setup() seconds, median of {args.repeat} runs each")
    print(f"  fresh start (initialization runs):        {fresh:.2f}  {[round(s, 2) for s in seconds['fresh']]}")
    for name, said in (("before", "resumed, data drawn before the model"), ("after", "resumed, data drawn after it")):
        median = statistics.median(seconds[name])
        print(f"  {said + ':':42s}{median:.2f}  {[round(s, 2) for s in seconds[name]]}  ({median / fresh:.2f} x fresh)")
    print(f"  the resume's note: {notes[0] if notes else '(none)'}")
    print(f"  {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
