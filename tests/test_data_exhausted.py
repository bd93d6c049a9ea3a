"""A step that reads past the end of its data (StopIteration): a pause that says so, not a failure with no message.

The shape of pytorch/examples' ddp-tutorial-series trainer ported to `step()`: a generator of batches over a fixed
number of epochs, read with `next()`. A plain loop simply ends there. Under vram-bench the session pauses with the
model kept, names the line, a save does not resume it (the iterator stays exhausted), a rebuild does (setup() makes
a new iterator, weights carried); headless with stdin closed, the run ends as a plain loop would: final snapshot,
exit code 0.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import torch
from rich.text import Text

from tests.test_headless import STARTUP_TIMEOUT, Headless
from workbench.frontends.tui.widgets.reload_log import render_entry
from workbench.protocol.events import Error

BATCHES_PER_EPOCH = 4

PROJECT = textwrap.dedent(
    f"""
    import torch

    EPOCHS = 2
    LR = 0.1


    def batches(epochs, rank):
        g = torch.Generator().manual_seed(rank)
        data = torch.randn({BATCHES_PER_EPOCH} * 8, 4, generator=g)
        for epoch in range(epochs):
            for i in range({BATCHES_PER_EPOCH}):
                yield data[i * 8:(i + 1) * 8]


    def setup(bench):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        if bench.world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        return {{"model": model, "opt": torch.optim.SGD(model.parameters(), lr=LR), "batches": batches(EPOCHS, bench.rank)}}


    def step(state, bench):
        x = next(state["batches"])
        loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
        state["opt"].zero_grad()
        loss.backward()
        state["opt"].step()
        return loss
    """
)


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text(PROJECT)
    return folder / "train.py"


def test_the_data_running_out_pauses_naming_the_line_a_save_keeps_it_paused_and_a_rebuild_trains_on(tmp_path: Path):
    train = project(tmp_path)
    run = Headless(train)
    try:
        end = 2 * BATCHES_PER_EPOCH
        paused = run.wait_event("paused", STARTUP_TIMEOUT, reason="data exhausted")
        assert paused["step"] == end
        error = next(e for e in run.events if e["event"] == "error")
        assert error["where"] == "data" and error["file"] == "train.py"
        assert error["line"] == next(n for n, text in enumerate(PROJECT.splitlines(), 1) if "next(state" in text)
        assert f"the data ran out in step {end + 1}" in error["message"]
        assert '`x = next(state["batches"])`' in error["message"]
        assert f"hold step {end}" in error["message"] and "rebuild" in error["message"]
        assert "StopIteration" in error["traceback"]

        # A save is applied, and leaves the pause as it is: nothing new to read.
        train.write_text(PROJECT.replace("EPOCHS = 2", "EPOCHS = 1"))
        reload = run.wait_event("reload", ok=True)
        assert reload["changed"] == ["EPOCHS"]
        run.send("step")  # a single step reads past the end again: the same pause, the same step count
        again = run.wait_event("paused", reason="data exhausted")
        assert again["step"] == end
        assert not any(e["event"] == "resumed" for e in run.since(paused))

        # A rebuild makes a new iterator (EPOCHS is now 1), carries the weights over and trains on.
        run.send("rebuild")
        rebuilt = run.wait_event("rebuild", 30)
        assert rebuilt["ok"] and rebuilt["tensors_carried"] == 2
        run.wait_event("resumed", reason="rebuild")
        second = run.wait_event("paused", reason="data exhausted")
        assert second["step"] == end + BATCHES_PER_EPOCH
        run.send("quit")
        assert run.finish() == 0, run.explain()
    finally:
        run.close()


def test_with_stdin_closed_the_data_running_out_ends_the_run_with_a_final_snapshot_and_code_0(tmp_path: Path):
    run = Headless(project(tmp_path), stdin=subprocess.DEVNULL)
    try:
        assert run.finish(timeout=STARTUP_TIMEOUT) == 0, run.explain()
        end = 2 * BATCHES_PER_EPOCH
        snapshot = next(e for e in run.events if e["event"] == "snapshot")
        assert (snapshot["reason"], snapshot["step"]) == ("final", end)
        state = torch.load(snapshot["path"], weights_only=True)
        assert state["step"] == end
        assert run.events[-1] == {**run.events[-1], "event": "exit", "reason": "data exhausted", "code": 0, "step": end}
    finally:
        run.close()


def test_under_torchrun_both_ranks_run_out_together_and_end_with_one_report_and_rank_0s_final_snapshot(tmp_path: Path):
    run = Headless(project(tmp_path), "--nproc-per-node", "2", stdin=subprocess.DEVNULL)
    try:
        assert run.finish(timeout=2 * STARTUP_TIMEOUT) == 0, run.explain()
        end = 2 * BATCHES_PER_EPOCH
        errors = [e for e in run.events if e["event"] == "error"]
        assert len(errors) == 1 and "the data ran out" in errors[0]["message"], errors  # both ranks' say the same
        steps = {(e["rank"], e["step"]) for e in run.events if e["event"] == "step"}
        assert steps == {(rank, n) for rank in (0, 1) for n in range(1, end + 1)}
        snapshot = next(e for e in run.events if e["event"] == "snapshot")
        assert (snapshot["reason"], snapshot["step"]) == ("final", end)
        assert run.events[-1] == {**run.events[-1], "event": "exit", "reason": "data exhausted", "code": 0}
    finally:
        run.close()


def test_the_app_logs_it_as_the_data_s_end_not_as_a_failure_a_save_would_fix(tmp_path: Path):
    message = "the data ran out in step 9: StopIteration at train.py:25 (`x = next(state[\"batches\"])`), ..."
    line = render_entry(Error(where="data", message=message, file="train.py", line=25), tmp_path, timestamps=False)
    assert isinstance(line, Text) and line.plain.startswith("DATA ENDED the data ran out in step 9")
    assert "save a fix" not in line.plain
