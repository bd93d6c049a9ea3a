"""The control plane's blocking agreement (`gather_text`) between three real processes on gloo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 3


def _rank(rank: int, init_file: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from workbench.engine.control_plane import ControlPlane

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        plane = ControlPlane(dist.group.WORLD, rank, WORLD)
        results = {
            "nobody": plane.gather_text(None),
            "rank 1 objects": plane.gather_text("rank 1 cannot plan: naïve ✓" if rank == 1 else None),
            "empty is not nothing": plane.gather_text(""),
            "each its own": plane.gather_text(f"{rank}" * (rank + 1) if rank != 0 else None),
            "then nobody again": plane.gather_text(None),
        }
        Path(out, f"{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_every_ranks_text_or_none_in_rank_order(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    expected = {
        "nobody": [None, None, None],
        "rank 1 objects": [None, "rank 1 cannot plan: naïve ✓", None],
        "empty is not nothing": ["", "", ""],
        "each its own": [None, "11", "222"],
        "then nobody again": [None, None, None],
    }
    for rank in range(WORLD):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == expected
