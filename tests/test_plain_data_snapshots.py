"""Snapshots are read as plain data only: a file that would run code when unpickled is refused, nothing is loaded.

One-file snapshots load with `torch.load(weights_only=True)`. Sharded ones go through torch.distributed.checkpoint,
which unpickles its `.metadata` and its non-tensor values without that guard; vram-bench checks both first
(workbench/engine/actions/plain_data_dcp.py).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from workbench.engine.actions.sharded_snapshot import _state_dict, load_sharded, write_sharded
from workbench.engine.actions.snapshot import load_snapshot, write_snapshot
from workbench.errors import UserError


class MakesAFolder:
    """Unpickling it creates a folder: the stand-in for code a hostile snapshot would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.mkdir, (str(self.marker),))


def trained_state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer}


def fresh_state() -> dict:
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 3)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def test_a_one_file_snapshot_holding_an_object_is_refused_without_running_it(tmp_path):
    event = write_snapshot(trained_state(), 7, 0, tmp_path, training_globals={"train.epoch": 2})
    payload = torch.load(event.path, weights_only=True)
    marker = tmp_path / "ran"
    payload["globals"]["train.epoch"] = MakesAFolder(marker)
    torch.save(payload, event.path)

    with pytest.raises(UserError, match="damaged or not a snapshot"):
        load_snapshot(Path(event.path))
    assert not marker.exists()


def test_a_sharded_snapshot_loads_into_a_fresh_state(tmp_path):
    trained = trained_state()
    event = write_sharded(trained, 7, 0, tmp_path, writer_pid=os.getpid(), is_main=True, keep=3)
    fresh = fresh_state()

    report, _ = load_sharded(fresh, Path(event.path))

    assert report.clean and report.tensors == 2 and report.optimizers == 1
    assert torch.equal(fresh["model"].weight, trained["model"].weight)
    assert fresh["optimizer"].state_dict()["state"][0]["step"] == 1


def test_sharded_metadata_that_would_run_code_is_refused_and_nothing_is_loaded(tmp_path):
    event = write_sharded(trained_state(), 7, 0, tmp_path, writer_pid=os.getpid(), is_main=True, keep=3)
    marker = tmp_path / "ran"
    (Path(event.path) / ".metadata").write_bytes(pickle.dumps(MakesAFolder(marker)))
    fresh = fresh_state()
    before = fresh["model"].weight.detach().clone()

    with pytest.raises(UserError, match=r"\.metadata is not plain checkpoint metadata .*posix\.mkdir|os\.mkdir"):
        load_sharded(fresh, Path(event.path))

    assert not marker.exists()
    assert torch.equal(fresh["model"].weight, before)


def test_a_sharded_value_that_would_run_code_is_refused_before_any_tensor_is_loaded(tmp_path):
    # Written as vram-bench writes one, but with an object where a param group's learning rate is.
    event = write_sharded(trained_state(), 7, 0, tmp_path, writer_pid=os.getpid(), is_main=True, keep=3)
    marker = tmp_path / "ran"
    state_dict = _state_dict(trained_state(), ())
    state_dict["optim/optimizer"]["param_groups"][0]["lr"] = MakesAFolder(marker)
    for item in Path(event.path).glob("*.distcp"):
        item.unlink()
    (Path(event.path) / ".metadata").unlink()
    dcp.save(state_dict, checkpoint_id=event.path, no_dist=True)
    fresh = fresh_state()
    before = fresh["model"].weight.detach().clone()

    with pytest.raises(UserError, match=r"holds the value optim/optimizer\.param_groups\.0\.lr.* is not plain data"):
        load_sharded(fresh, Path(event.path))

    assert not marker.exists()
    assert torch.equal(fresh["model"].weight, before), "a tensor was loaded before the refusal"
