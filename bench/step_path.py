"""Where a step's time goes under vram-bench: the user's step() and each piece of vram-bench's own path around it.

bench/loss_sync.py says how far vram-bench's steps/s is from a loop that never waits; this says which piece the
difference is. A child process runs `vram-bench run --headless` on loss_sync's model, with a timer around the
user's step(), the whole step, and each piece the training thread runs every step (reading the loss off the device,
the GPU peak, the step's record). Mean microseconds a step, from step 600 on (after warm-up). The timers cost about
a microsecond each, so read the pieces, not the total, against loss_sync's figures.

    python bench/step_path.py [--device cuda] [--steps 3000] [--width 2048] [--depth 4] [--batch 256]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARM_UP_STEPS = 600

WORKER_PIECES = ("_record_values", "_track_new_modules", "_handle_commands", "_check_max_steps", "_settle_values")
PROBE_PIECES = ("reset_peaks", "peak_allocated")


def run_timed_session(argv: list[str]) -> None:
    """In the child: vram-bench's CLI with timers around the step path; prints one line to stderr at the end."""
    sys.path.insert(0, str(REPO))
    from workbench.engine import project, worker
    from workbench.engine.memory import device

    spent: defaultdict[str, float] = defaultdict(float)
    counting = [False]
    steps = [0]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if counting[0]:
                    spent[name] += time.perf_counter() - started
        return wrapper

    worker.start_reading = timed("start_reading (the loss off the device)", worker.start_reading)
    for name in PROBE_PIECES:
        setattr(device.TorchNvmlProbe, name, timed(f"probe.{name}", getattr(device.TorchNvmlProbe, name)))
    for name in WORKER_PIECES:
        setattr(worker.TrainingWorker, name, timed(name, getattr(worker.TrainingWorker, name)))
    function = project.Project.function
    project.Project.function = lambda self, name: (  # type: ignore[method-assign]
        timed("the user's step()", fn) if name == "step" and (fn := function(self, name)) is not None else function(self, name))
    run_step, run = worker.TrainingWorker._run_step, worker.TrainingWorker.run

    def timed_step(self: Any) -> None:
        timed("_run_step (all of it)", run_step)(self)
        steps[0] += counting[0]
        counting[0] = counting[0] or self.step >= WARM_UP_STEPS

    def reporting_run(self: Any) -> None:
        try:
            run(self)
        finally:
            per_step = {name: seconds / max(steps[0], 1) * 1e6 for name, seconds in spent.items()}
            print(f"{steps[0]} steps; us a step: " + ", ".join(
                f"{name} {us:.1f}" for name, us in sorted(per_step.items(), key=lambda kv: -kv[1])), file=sys.stderr)

    worker.TrainingWorker._run_step, worker.TrainingWorker.run = timed_step, reporting_run  # type: ignore[method-assign]
    from workbench.cli import main

    sys.argv = ["vram-bench", *argv]
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda when torch sees a GPU, else cpu")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    import torch
    from loss_sync import MODEL, UNDER_VRAM_BENCH  # bench/ is this script's folder, hence on sys.path

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.py").write_text(MODEL)
        (Path(tmp) / "train.py").write_text(UNDER_VRAM_BENCH)
        env = {**os.environ, "PYTHONPATH": str(REPO), "LOSS_SYNC_SHAPE": f"{args.width},{args.depth},{args.batch}"}
        child = [sys.executable, __file__, "--child", "run", "train.py", "--headless", "--no-watch", "--device", device,
                 "--max-steps", str(args.steps)]
        done = subprocess.run(child, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=900)
    report = [line for line in done.stderr.splitlines() if " us a step: " in line]
    if done.returncode != 0 or not report:
        raise SystemExit(f"the session failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else f"{os.cpu_count()} CPU cores"
    print(f"MLP {args.width}x{args.depth}, batch {args.batch}, AdamW, on {device} ({name}); torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    for piece in report[-1].split(" us a step: ", 1)[1].split(", "):
        print(f"  {piece}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        run_timed_session(sys.argv[2:])
    else:
        main()
