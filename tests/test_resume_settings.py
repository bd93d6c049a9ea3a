"""A resume goes on with the snapshot's hyperparameters and names those the code now sets otherwise.

A Lion trainer (lucidrains/lion-pytorch, ported) resumed after `LR = 3e-3` -> `1e-3` and an edit of the optimizer's
default betas trained on with the snapshot's lr and betas, and the `resume` event said nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import is_event, make_project, open_session, snapshot_after

PROJECT = """\
import torch

LR = 0.1
torch.manual_seed(0)
DATA = torch.randn(16, 3)


def setup(bench):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    SCHEDULE
    return {"model": model, "opt": opt, "sched": sched}


def step(state, bench):
    SETS_LR
    loss = state["model"](DATA).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    if state["sched"] is not None:
        state["sched"].step()
    return {"loss": loss, "lr": state["opt"].param_groups[0]["lr"]}
"""

NO_SCHEDULE = "sched = None"
STEP_LR = "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)"
ONE_CYCLE = "sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=100)"


def resume_notes(tmp_path: Path, source: str, edited: str) -> tuple[tuple[str, ...], float]:
    """The notes of a resume of `edited` from `source`'s snapshot at step 4, and the lr its step 5 trained with."""
    snapshot = snapshot_after(tmp_path, source, 4)
    root = make_project(tmp_path, {"train.py": edited}, folder="resumed")
    with open_session(root / "train.py", resume=snapshot, max_steps=5, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        step = live.wait_for(is_event("step", step=5), timeout=60)
        return resumed.notes, step.scalars["lr"]


def project(schedule: str = NO_SCHEDULE, sets_lr: str = "pass") -> str:
    return PROJECT.replace("SCHEDULE", schedule).replace("SETS_LR", sets_lr)


def test_an_edited_learning_rate_is_named_where_the_snapshots_goes_on(tmp_path: Path) -> None:
    source = project()
    notes, lr = resume_notes(tmp_path, source, source.replace("LR = 0.1", "LR = 0.05"))
    said = [n for n in notes if n.startswith("opt goes on with the hyperparameters the snapshot's run had at step 4")]
    assert said and "lr: setup() makes 0.05 now, the snapshot's run was made with 0.1 and goes on with 0.1" in said[0] \
        and "press R" in said[0], notes
    assert "momentum" not in said[0], "only what differs"
    assert lr == 0.1, "what the note says: the snapshot's value trains"


WARM_UP = "sched = None\n    opt.param_groups[0]['lr'] = LR / 10  # a project's own warm-up, stepped below"
STEPPED_WARM_UP = "state['opt'].param_groups[0].update(lr=min(LR, state['opt'].param_groups[0]['lr'] * 2))"


@pytest.mark.parametrize("schedule", [NO_SCHEDULE, STEP_LR, ONE_CYCLE], ids=["none", "StepLR", "OneCycleLR"])
def test_nothing_is_said_where_the_code_has_not_changed(tmp_path: Path, schedule: str) -> None:
    """A schedule moves the rate (and OneCycleLR the momentum) away from what setup() made: not an edit. Compared as
    made, with what the snapshot's run was made with."""
    source = project(schedule)
    notes, _ = resume_notes(tmp_path, source, source)
    assert not any("goes on with the hyperparameters" in n for n in notes), notes


def test_a_schedules_edited_base_rate_is_named(tmp_path: Path) -> None:
    source = project(STEP_LR)
    notes, _ = resume_notes(tmp_path, source, source.replace("LR = 0.1", "LR = 0.05"))
    assert any("initial_lr: setup() makes 0.05 now, the snapshot's run was made with 0.1" in n for n in notes), notes


def test_a_rate_a_library_or_the_project_moves_without_assigning_it_is_not_taken_for_an_edit(tmp_path: Path) -> None:
    """timm's schedulers and a project's own warm-up set the rate through code that is not `group['lr'] = ...` in
    the project: the snapshot's rate differed from what setup() made, and was named as if the code had changed."""
    source = project(WARM_UP, STEPPED_WARM_UP)
    notes, lr = resume_notes(tmp_path, source, source)
    assert not any("goes on with the hyperparameters" in n for n in notes), notes
    assert lr == 0.1, "the warm-up's place goes on"


def test_a_rate_the_step_sets_is_not_named(tmp_path: Path) -> None:
    """nanoGPT's `param_group['lr'] = lr` in the step: the code's value reaches the optimizer at the next step."""
    source = project(sets_lr="for group in state['opt'].param_groups: group['lr'] = LR")
    notes, lr = resume_notes(tmp_path, source, source.replace("LR = 0.1", "LR = 0.05"))
    assert not any("goes on with the hyperparameters" in n for n in notes), notes
    assert lr == 0.05
