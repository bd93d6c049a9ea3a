"""The control group rides on the training group's gloo device (no second I/O loop thread), and works."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _gloo_loops() -> int:
    """gloo's I/O loop threads in this process: one per gloo device."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            pass
    return names.count("gloo_tcp_loop")


def _rank(rank: int, init_file: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from datetime import timedelta

    from workbench.engine.control_group import default_gloo_devices, new_control_group
    from workbench.engine.control_plane import ControlPlane

    report: dict[str, object] = {"devices before init": default_gloo_devices()}
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        report["loops, training group only"] = _gloo_loops()
        control = new_control_group(timedelta(seconds=60))
        report["loops, with the control group"] = _gloo_loops()
        # Both groups in use at once: a control exchange in flight while the training group reduces.
        exchange = ControlPlane(control, rank, WORLD).post_bytes(f"r{rank}".encode(), [2, 2])
        grads = torch.full((1000,), float(rank + 1))
        dist.all_reduce(grads)
        report["gathered"] = [data.decode() for data in exchange.collect()]
        report["reduced"] = grads[0].item()
        report["control timeout"] = control._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        report["texts"] = ControlPlane(control, rank, WORLD).gather_text(f"rank {rank}")
        dist.destroy_process_group(control)
        report["training group after the control group is gone"] = _all_reduced(rank)
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps(report))


def _all_reduced(rank: int) -> float:
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    return value.item()


def test_the_control_group_shares_the_training_groups_gloo_device_and_both_work(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    for rank in range(WORLD):
        report = json.loads((tmp_path / f"{rank}.json").read_text())
        assert report["devices before init"] is None, "no default group: a device of its own"
        assert report["loops, training group only"] == 1
        assert report["loops, with the control group"] == 1, "the control group made a gloo device (an I/O loop) of its own"
        assert report["gathered"] == ["r0", "r1"]
        assert report["reduced"] == 3.0
        assert report["control timeout"] == 60.0
        assert report["texts"] == ["rank 0", "rank 1"]
        assert report["training group after the control group is gone"] == 1.0
