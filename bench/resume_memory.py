"""Resume of a 124M-parameter snapshot: peak host memory and time, vram-bench's way against a naive load.

A GPT-2 124M model with AdamW (after one step, so the optimizer has state) is
snapshotted with vram-bench's writer. Then, each in a fresh process:
- vram-bench: setup() builds model + optimizer, the snapshot is mapped
  (`torch.load(mmap=True, weights_only=True)`) and copied in (`apply_snapshot`);
- naive: the same setup(), `torch.load` of the whole file, `load_state_dict` for both.
Peak anonymous and file-backed memory above the pre-load baseline, as x of the snapshot size.

    python bench/resume_memory.py [--size 124M]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHILD = """
import json, sys, time
from pathlib import Path
import torch
from workbench.loadbench_worker import GPT2, PeakSampler, config, read_status
from workbench.actions.snapshot import apply_snapshot, load_snapshot

method, path, size = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
baseline = read_status()
started = time.perf_counter()
with PeakSampler() as peaks:
    model = GPT2(config(size))
    state = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}
    if method == "vram-bench":
        apply_snapshot(state, load_snapshot(path), path)
    else:
        payload = torch.load(path, weights_only=True)
        model.load_state_dict(payload["modules"]["model"])
        state["opt"].load_state_dict(payload["optimizers"]["opt"])
        del payload
seconds = time.perf_counter() - started
print(json.dumps({"method": method, "seconds": seconds,
                  **{k: peaks.peak[k] - baseline[k] for k in ("anon", "file", "rss")}}))
"""


def make_snapshot(folder: Path, size: str) -> Path:
    import torch

    from workbench.actions.snapshot import write_snapshot
    from workbench.loadbench_worker import GPT2, config

    torch.manual_seed(0)
    model = GPT2(config(size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 100, (1, 8))
    out = model(tokens)
    (out[0] if isinstance(out, tuple) else out).float().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    event = write_snapshot({"model": model, "opt": opt}, 1, 0, folder)
    return Path(event.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="124M")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_snapshot(Path(tmp), args.size)
        size = path.stat().st_size
        results = {}
        for method in ("naive", "vram-bench"):
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=False)  # same page cache for both
            out = subprocess.run([sys.executable, "-c", CHILD, method, str(path), args.size], capture_output=True,
                                 text=True, cwd=REPO, check=True)
            results[method] = json.loads(out.stdout.strip().splitlines()[-1])
    gib = 2**30
    print(f"resume of a GPT-2 {args.size} + AdamW snapshot ({size / gib:.2f} GiB), each in a fresh process")
    print(f"{'method':<12} {'time s':>7} {'peak anon':>10} {'x snap':>7} {'peak file':>10} {'peak RSS':>9} {'x snap':>7}")
    for method, r in results.items():
        print(f"{method:<12} {r['seconds']:>7.2f} {r['anon'] / gib:>9.2f}G {r['anon'] / size:>7.2f} {r['file'] / gib:>9.2f}G "
              f"{r['rss'] / gib:>8.2f}G {r['rss'] / size:>7.2f}")
    ours, naive = results["vram-bench"], results["naive"]
    print(f"vram-bench / naive: anon {ours['anon'] / naive['anon']:.2f}x, time {ours['seconds'] / naive['seconds']:.2f}x")
    print(f"{platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
