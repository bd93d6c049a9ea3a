"""Write a checkpoint of every module and optimizer in the session state, atomically.

Temp file, flush, fsync, rename: a crash mid-write never leaves a half file
under the final name.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from workbench.events import Snapshot
from workbench.state_walk import find_modules_and_optimizers

FORMAT = "vram-bench-snapshot/1"


def write_snapshot(state: Any, step: int, code_version: int, run_dir: Path) -> Snapshot:
    modules, optimizers = find_modules_and_optimizers(state)
    if not modules and not optimizers:
        raise ValueError("the state returned by setup() holds no nn.Module or optimizer to snapshot")
    payload = {
        "format": FORMAT,
        "step": step,
        "code_version": code_version,
        "modules": {name: m.state_dict() for name, m in modules.items()},
        "optimizers": {name: o.state_dict() for name, o in optimizers.items()},
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
    }
    folder = run_dir / "snapshots"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step:08d}.pt"
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return Snapshot(path=str(final), bytes=final.stat().st_size, step=step)
