"""Host memory of a sharded snapshot that holds a project object's model-sized state (an EMA's shadow weights).

Each variant runs in a fresh process (one rank, no process group: DCP's single-process path), builds a model and an
EMA of it (`--mib` of shadows), then writes one sharded snapshot, sampling its own RSS at 200 Hz; the figure is the
peak above the RSS just before the write:

- baseline: `dcp.save` of the model and the EMA's shadows as plain DCP tensors (what torch itself does with them);
- packed: the model through DCP and the EMA's state serialized into the rank's record (torch.save into bytes, then a
  uint8 tensor of them), as vram-bench wrote it before the twenty-third sitting;
- vram-bench: `write_sharded` as the worker calls it now (sharded_states.py: the shadows as tensors beside the model).

Reported as the peak's ratio to the baseline's, median of `--repeat` rounds, order rotated each round.

    python bench/sharded_state_memory.py [--mib 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("baseline", "packed", "vram-bench")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_variant(variant: str, mib: int, folder: str) -> None:
    """In the child: one write; prints the peak RSS above the start, in MiB."""
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed.checkpoint as dcp

    from workbench.engine.actions.sharded_snapshot import write_sharded
    from workbench.engine.actions.sharded_states import tensors_and_layout
    from workbench.engine.loader_places import LAYOUT, pack, record

    side = int((mib * 2**20 / 4) ** 0.5)
    model = torch.nn.Linear(side, side, bias=False)

    class EMA:
        __module__ = "train"

        def __init__(self) -> None:
            self.shadow = {"weight": model.weight.detach().clone()}

        def state_dict(self) -> dict:
            return self.shadow

        def load_state_dict(self, state: dict) -> None:
            self.shadow = state

    ema = EMA()
    start = rss_bytes()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if variant == "baseline":
        dcp.save({"model": model.state_dict(), "ema": ema.state_dict()}, checkpoint_id=folder, no_dist=True)
    elif variant == "packed":
        kept = record({"ema": ema})
        kept["states"]["ema"] = kept.pop("large")["ema"]
        holder = torch.frombuffer(bytearray(pack(kept)), dtype=torch.uint8)
        dcp.save({"model": model.state_dict(), "loader_places/rank0": holder}, checkpoint_id=folder, no_dist=True)
    else:
        kept = record({"ema": ema})
        tensors, kept[LAYOUT] = tensors_and_layout(kept.pop("large"), 0, {"ema"})
        write_sharded({"model": model}, 1, 0, Path(folder), writer_pid=os.getpid(), is_main=True, keep=1,
                      loader_record=kept, large=tensors)
    done.set()
    sampler.join()
    print(f"{(peak[0] - start) / 2**20:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512, help="the EMA's shadows (and the model), MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        run_variant(args.variant, args.mib, args.folder)
        return
    peaks: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.repeat):
        order = VARIANTS[round_ % 3:] + VARIANTS[:round_ % 3]
        for variant in order:
            with tempfile.TemporaryDirectory() as folder:
                out = subprocess.run([sys.executable, __file__, "--variant", variant, "--mib", str(args.mib),
                                      "--folder", os.path.join(folder, "s.dcp")],
                                     capture_output=True, text=True, check=True)
                peaks[variant].append(float(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(peaks["baseline"])
    print(f"sharded snapshot of a {args.mib} MiB model and a {args.mib} MiB EMA, peak RSS above the start "
          f"(median of {args.repeat}):")
    for variant in VARIANTS:
        median = statistics.median(peaks[variant])
        print(f"  {variant:<11} {median:8.1f} MiB   x{median / base if base else float('nan'):.2f} of baseline   "
              f"rounds: {', '.join(f'{p:.0f}' for p in peaks[variant])}")


if __name__ == "__main__":
    main()
