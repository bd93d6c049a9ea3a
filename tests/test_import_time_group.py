"""Under torchrun the default process group exists while the project is imported (workbench/engine/import_time_group.py).

Found porting pytorch/examples' dcgan under DDP (`DistributedSampler(dataset) if dist.is_initialized() else None` at
import: each rank trained on the whole dataset, silently) and its tensor-parallel example (`init_device_mesh` at
import made a group of torch's own, backend "undefined").
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.test_distributed import project_folder, steps_of
from tests.test_headless import Headless
from workbench.engine.import_time_group import default_group_at_import

SCRIPT = textwrap.dedent(
    """\
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed import init_process_group
    from torch.distributed.device_mesh import init_device_mesh

    init_process_group(backend="gloo", timeout=timedelta(seconds=60))  # kept from the script it was
    RANK = dist.get_rank()
    sampler = torch.utils.data.distributed.DistributedSampler(list(range(10))) if dist.is_initialized() else None
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))


    def setup(bench):
        return {"model": torch.nn.Linear(2, 1)}


    def step(state, bench):
        mine = list(iter(sampler)) if sampler is not None else list(range(10))
        return {"loss": 0.0, "rank": float(RANK), "first": float(mine[0]), "count": float(len(mine)),
                "mesh": float(mesh.size())}
    """
)


def test_what_a_script_builds_at_import_from_the_default_group_works_and_its_own_init_is_skipped_and_said(tmp_path: Path):
    run = Headless(project_folder(tmp_path, SCRIPT) / "train.py", "--nproc-per-node", "2", "--max-steps", "2")
    try:
        assert run.finish(timeout=90) == 0, run.stderr
    finally:
        run.close()
    start = next(e for e in run.events if e["event"] == "start")
    assert start["backend"] == "gloo", start
    (note,) = [e for e in run.events if e["event"] == "error" and e["where"] == "torchrun"]
    assert note["message"].startswith("train.py:8 called init_process_group (backend 'gloo'): skipped, as vram-bench "
                                      "made the default process group (gloo) before importing the project"), note
    assert "timeout not used" in note["message"]
    zero = steps_of(run.events, 0)[1]["scalars"]
    assert zero == {"rank": 0.0, "first": zero["first"], "count": 5.0, "mesh": 2.0}, "each rank gets its half"


def test_after_the_import_init_process_group_is_torchs_own_again() -> None:
    """A name the script imported keeps the wrapper; once the import is over it calls torch's own, whose error
    setup_error_hint explains (tests/test_setup_error_hint.py)."""

    class Groups:
        skipped_inits: list[str] = []

        def make_default(self) -> None:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    try:
        with default_group_at_import(Groups()):  # type: ignore[arg-type]
            from torch.distributed import init_process_group as imported

            imported("gloo")
            assert len(Groups.skipped_inits) == 1
        assert dist.init_process_group is not imported, "torch's own is back"
        with pytest.raises(ValueError, match="twice"):
            imported("gloo", store=dist.HashStore(), rank=0, world_size=1)
    finally:
        dist.destroy_process_group()


def test_x_and_a_rebuild_skip_the_scripts_init_process_group_again(tmp_path: Path) -> None:
    """llm.c's `if ddp: init_process_group(backend="nccl")` block, run again by x or R because a value it reads changed
    (`--zero_stage`): the call the import skipped failed the whole run of statements ("initialize the default process
    group twice"). `Project.as_script()`, which x and R run module statements in, skips it again, through the name the
    script imported and through `dist.init_process_group`."""
    from workbench.engine.import_time_group import inits_skipped_again
    from workbench.engine.project import load_project, unload_project

    class Groups:
        skipped_inits: list[str] = []

        def make_default(self) -> None:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    entry = tmp_path / "proj" / "train.py"
    entry.parent.mkdir()
    entry.write_text("import torch\n\ndef setup(bench):\n    return {}\n\ndef step(state, bench):\n    return 0.0\n")
    try:
        with default_group_at_import(Groups()):  # type: ignore[arg-type]
            from torch.distributed import init_process_group as imported
        with inits_skipped_again():
            imported("nccl")
            dist.init_process_group("nccl")
        project = load_project(entry)
        try:
            with project.as_script():
                imported("gloo")
        finally:
            unload_project(project)
        with pytest.raises(ValueError, match="twice"):
            imported("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
