"""LR schedulers are part of what a snapshot holds: after a resume the schedule goes on from the snapshot's step.

Before, a snapshot held the optimizers (whose param groups keep the rate a scheduler set last) and not the
schedulers: a resume started every schedule over against the restored rate (OneCycleLR back in its warm-up at
step 25,501 of a run, `last_epoch` 1), and the `resume` event said nothing. Checked by difference: a run that
snapshots, resumes into a fresh `setup()` and goes on has the same learning rates at every step as one that never
stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler

from tests.conftest import is_event, make_project, open_session
from workbench.engine.actions.schedulers import find_schedulers
from workbench.engine.scheduler_carry import as_made, carry_schedulers, rates_before
from workbench.engine.actions.snapshot import (
    apply_snapshot,
    load_snapshot,
    write_snapshot,
)


def setup_like() -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """What a setup() makes: a warm-up then cosine in the state, and a StepLR a module global holds (script style)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    warmup = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
    sched = lr_scheduler.SequentialLR(opt, [warmup, lr_scheduler.CosineAnnealingLR(opt, T_max=20)], milestones=[5])
    head = torch.nn.Linear(1, 1)
    opt2 = torch.optim.AdamW(head.parameters(), lr=0.01)
    namespace = {"__name__": "train", "opt2": opt2, "sched2": lr_scheduler.StepLR(opt2, step_size=3, gamma=0.5),
                 "head": head}
    return {"model": model, "opt": opt, "sched": sched}, [("train", namespace)]


def train(state: dict[str, Any], namespaces: list[tuple[str, dict[str, Any]]], steps: int) -> list[tuple[float, float]]:
    """`steps` steps; the two optimizers' rates at each."""
    globals_ = namespaces[0][1]
    rates = []
    for _ in range(steps):
        loss = state["model"](torch.ones(2, 4)).pow(2).mean() + globals_["head"](torch.ones(2, 1)).pow(2).mean()
        state["opt"].zero_grad()
        globals_["opt2"].zero_grad()
        loss.backward()
        state["opt"].step()
        globals_["opt2"].step()
        state["sched"].step()
        globals_["sched2"].step()
        rates.append((state["opt"].param_groups[0]["lr"], globals_["opt2"].param_groups[0]["lr"]))
    return rates


class Trainer:
    """pytorch/examples' shape: the trainer object a module global holds keeps the scheduler."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.scheduler = lr_scheduler.ExponentialLR(opt, gamma=0.9)


def test_schedulers_are_found_in_the_state_and_in_module_globals_by_path() -> None:
    state, namespaces = setup_like()
    found = find_schedulers(state, namespaces)
    assert set(found) == {"sched", "train.sched2"}
    assert found["sched"] is state["sched"] and found["train.sched2"] is namespaces[0][1]["sched2"]
    namespaces[0][1]["trainer"] = trainer = Trainer(state["opt"])
    namespaces[0][1]["data"] = list(range(100_000))  # walked no further than its first items
    found = find_schedulers(state, namespaces)
    assert found["train.trainer.scheduler"] is trainer.scheduler and len(found) == 3


def test_a_resumed_run_has_the_learning_rates_of_a_run_that_never_stopped(tmp_path: Path) -> None:
    state, namespaces = setup_like()
    uninterrupted = train(state, namespaces, 14)

    state, namespaces = setup_like()
    before = train(state, namespaces, 6)
    snapshot = write_snapshot(state, 6, 0, tmp_path, namespaces=namespaces)

    state, namespaces = setup_like()  # a fresh setup(), as `--resume` runs it
    report = apply_snapshot(state, load_snapshot(Path(snapshot.path)), Path(snapshot.path), namespaces=namespaces)
    assert (report.schedulers, report.optimizers, report.scheduler_notes) == (2, 2, [])
    assert state["sched"].last_epoch == 6 and namespaces[0][1]["sched2"].last_epoch == 6
    after = train(state, namespaces, 8)
    assert before + after == uninterrupted


def test_a_scheduler_that_cannot_be_loaded_starts_over_and_the_resume_says_why(tmp_path: Path) -> None:
    state, namespaces = setup_like()
    train(state, namespaces, 4)
    payload = load_snapshot(Path(write_snapshot(state, 4, 0, tmp_path, namespaces=namespaces).path))
    older = {k: v for k, v in payload.items() if k not in ("schedulers", "scheduler_types")}  # an older snapshot
    state, namespaces = setup_like()
    report = apply_snapshot(state, older, tmp_path / "old.pt", namespaces=namespaces)
    assert report.schedulers == 0 and state["sched"].last_epoch == 0
    assert len(report.scheduler_notes) == 2 and all("written before vram-bench kept schedulers" in n
                                                    for n in report.scheduler_notes), report.scheduler_notes
    assert report.scheduler_notes[0].startswith("sched (SequentialLR) is not in the snapshot")

    other = dict(payload, scheduler_types={**payload["scheduler_types"], "train.sched2": "torch.optim.lr_scheduler.ExponentialLR"})
    state, namespaces = setup_like()
    report = apply_snapshot(state, other, tmp_path / "other.pt", namespaces=namespaces)
    assert report.schedulers == 1 and state["sched"].last_epoch == 4 and namespaces[0][1]["sched2"].last_epoch == 0
    assert report.scheduler_notes == [
        "train.sched2: the snapshot holds a ExponentialLR's state, setup() made a StepLR: it starts its schedule over"
    ]


PROJECT = """\
import torch


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=40)
    return {"model": model, "opt": opt, "sched": sched}


def step(state, bench):
    loss = state["model"](torch.ones(2, 4)).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["sched"].step()
    return {"loss": loss, "lr": state["opt"].param_groups[0]["lr"]}
"""


def test_a_session_resumed_from_a_snapshot_goes_on_with_the_schedule_and_the_event_counts_it(tmp_path: Path) -> None:
    from workbench.protocol.events import Resume, TakeSnapshot

    root = make_project(tmp_path, {"train.py": PROJECT}, folder="first")
    with open_session(root / "train.py", max_steps=10, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        live.send(TakeSnapshot())
        snapshot = live.wait_for(is_event("snapshot"), timeout=20)
        live.session.worker.max_steps = 12
        live.send(Resume())
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        rates = [e.scalars["lr"] for e in live.events.of("step")]
    root = make_project(tmp_path, {"train.py": PROJECT}, folder="second")
    with open_session(root / "train.py", resume=Path(snapshot.path), max_steps=12, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=30)
        assert resumed.ok and resumed.schedulers == 1 and resumed.notes == (), resumed
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        assert [e.scalars["lr"] for e in live.events.of("step")] == rates[10:12]


def straight_and_rebuilt(tmp_path: Path, source: str, at: int, until: int) -> tuple[list[Any], list[Any], Any]:
    """(loss, lr) of each step of a session straight to `until`, and of one rebuilt after step `at` and resumed to
    `until`; the rebuild event."""
    from workbench.protocol.events import Rebuild, Resume

    root = make_project(tmp_path, {"train.py": source}, folder="straight")
    with open_session(root / "train.py", max_steps=until, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        straight = [(e.loss, e.scalars["lr"]) for e in live.events.of("step")]
    root = make_project(tmp_path, {"train.py": source}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=at, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=30)
        live.session.worker.max_steps = until
        live.send(Resume())
        live.wait_for(is_event("paused", reason="max steps"), timeout=30)
        after = [(e.loss, e.scalars["lr"]) for e in live.events.of("step")]
    return straight, after, rebuilt


def test_a_rebuild_with_no_change_goes_on_with_the_schedule_as_the_run_that_never_stopped(tmp_path: Path) -> None:
    """Before, setup()'s new OneCycleLR began its warm-up again at the rebuild (the rate fell from 0.0294 to 0.0020):
    a rebuild with no change trained otherwise than the run that never stopped."""
    straight, after, rebuilt = straight_and_rebuilt(tmp_path, PROJECT, 6, 12)
    assert rebuilt.ok and rebuilt.schedulers_carried == 1 and rebuilt.notes == (), rebuilt
    assert len(straight) == 12 and len({lr for _, lr in straight}) > 6, "the rate moves: the comparison means something"
    assert after == straight, [(k + 1, a, b) for k, (a, b) in enumerate(zip(straight, after)) if a != b]


def rebuilt(old_state: Any, old_namespaces: Any, old_made: Any, make_new: Any) -> tuple[Any, Any, int, list[str]]:
    """What a rebuild does with the schedulers: the rates before setup() runs again, the new ones as made, carried.
    `old_made`: `as_made` taken when the old state was made."""
    rates = rates_before(old_state, old_namespaces)
    new_state, new_namespaces = make_new()
    carried, notes = carry_schedulers(old_state, new_state, old_namespaces, new_namespaces, rates, old_made,
                                      as_made(new_state, new_namespaces))
    return new_state, new_namespaces, carried, notes


def stepped_then_rebuilt(made: Any, steps: int) -> tuple[dict[str, Any], int, list[str]]:
    """`made()` -> ({"opt": ..., "sched": ...}, namespaces) stepped `steps` times, then rebuilt: (the new state, how
    many schedules went on, the notes)."""
    old, namespaces = made()
    old_made = as_made(old, namespaces)
    for _ in range(steps):
        old["opt"].step()
        old["sched"].step()
    new, _, carried, notes = rebuilt(old, namespaces, old_made, made)
    return new, carried, notes


def test_a_rebuild_carries_each_schedule_setup_makes_again_with_the_rates_it_set() -> None:
    """A SequentialLR (warm-up, then cosine) in the state and a StepLR a module global holds: after the rebuild the
    new schedulers give the rates the old ones would have, step for step."""
    state, namespaces = setup_like()
    straight = train(state, namespaces, 14)
    old_state, old_namespaces = setup_like()
    old_made = as_made(old_state, old_namespaces)
    train(old_state, old_namespaces, 6)
    new_state, new_namespaces, carried, notes = rebuilt(old_state, old_namespaces, old_made, setup_like)
    assert (carried, notes) == (2, [])
    assert new_state["sched"].last_epoch == 6 and new_namespaces[0][1]["sched2"].last_epoch == 6
    assert new_state["opt"].param_groups[0]["lr"] == old_state["opt"].param_groups[0]["lr"]
    assert train(new_state, new_namespaces, 8) == straight[6:]


def test_a_schedule_whose_settings_changed_starts_over_and_the_notes_say_what_changed() -> None:
    old_state, old_namespaces = setup_like()
    old_made = as_made(old_state, old_namespaces)
    train(old_state, old_namespaces, 6)

    def edited() -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        state, namespaces = setup_like()
        opt = state["opt"]
        for group in opt.param_groups:  # a new SequentialLR over the same optimizer: a cosine of another length
            group["lr"] = group["initial_lr"]
        warmup = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
        state["sched"] = lr_scheduler.SequentialLR(opt, [warmup, lr_scheduler.CosineAnnealingLR(opt, T_max=30)], milestones=[5])
        namespaces[0][1]["sched2"] = lr_scheduler.ExponentialLR(namespaces[0][1]["opt2"], gamma=0.5)
        return state, namespaces

    new_state, _, carried, notes = rebuilt(old_state, old_namespaces, old_made, edited)
    assert carried == 0 and new_state["sched"].last_epoch == 0
    assert notes == [
        "sched (SequentialLR) starts its schedule over, as setup() made it: its settings changed "
        "(schedulers[1].T_max 20 -> 30), and a SequentialLR's rate at a step does not follow from its settings alone "
        "(the old one was at step 6); a rebuild that leaves its settings as they are goes on with the schedule",
        "train.sched2 (ExponentialLR) starts its schedule over, as setup() made it: setup() made a scheduler of another "
        "class there (it was a StepLR) (the old one was at step 6)",
    ], notes


def test_a_rebuild_carries_a_cycled_momentum_and_a_plateau_count() -> None:
    """OneCycleLR moves SGD's momentum with the rate; ReduceLROnPlateau's place is its best loss and bad-epoch count."""

    def made() -> tuple[dict[str, Any], tuple[()]]:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        other = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        return {"opt": opt, "cycle": lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=50),
                "other": other, "plateau": lr_scheduler.ReduceLROnPlateau(other, patience=1, factor=0.5)}, ()

    old, _ = made()
    old_made = as_made(old, ())
    for loss in (1.0, 0.5, 0.6, 0.7, 0.8):
        old["opt"].step()
        old["cycle"].step()
        old["plateau"].step(loss)
    new, _, carried, notes = rebuilt(old, (), old_made, made)
    assert (carried, notes) == (2, [])
    assert new["opt"].param_groups[0]["momentum"] == old["opt"].param_groups[0]["momentum"] != 0.95
    assert new["other"].param_groups[0]["lr"] == old["other"].param_groups[0]["lr"] == 0.05  # halved once
    assert (new["plateau"].best, new["plateau"].num_bad_epochs) == (0.5, old["plateau"].num_bad_epochs)


def test_a_rebuild_leaves_a_scheduler_it_did_not_make_again_alone() -> None:
    state, namespaces = setup_like()
    made = as_made(state, namespaces)
    train(state, namespaces, 3)
    _, _, carried, notes = rebuilt(state, namespaces, made, lambda: (state, namespaces))
    assert (carried, notes) == (0, []) and state["sched"].last_epoch == 3


def test_a_scheduler_made_again_over_the_optimizer_setup_kept_gets_the_rate_the_old_one_had_set() -> None:
    """A new scheduler sets its optimizer's groups to its own step 0 as it is made: over an optimizer setup() did not
    make again, the rate to carry is the one recorded before setup() ran."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = {"opt": opt, "sched": lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)}
    old_made = as_made(old, ())
    for _ in range(5):
        opt.step()
        old["sched"].step()
    assert opt.param_groups[0]["lr"] == 0.025
    new, _, carried, notes = rebuilt(old, (), old_made, lambda: ({"opt": opt, "sched": lr_scheduler.StepLR(
        opt, step_size=2, gamma=0.5)}, ()))  # the new one sets the rate back to 0.1 as it is made
    assert (carried, notes) == (1, [])
    assert opt.param_groups[0]["lr"] == 0.025 and new["sched"].last_epoch == 5
    new["sched"].step()
    assert opt.param_groups[0]["lr"] == 0.0125  # step 6 halves it, as in the run that never stopped


def test_the_app_logs_the_schedulers_a_resume_loaded(tmp_path: Path) -> None:
    from rich.text import Text

    from workbench.frontends.tui.widgets.reload_log import render_entry
    from workbench.protocol.events import ResumeLoaded

    event = ResumeLoaded(ok=True, path=str(tmp_path / "step-00000010.pt"), step=10, tensors=2, optimizers=1, schedulers=1)
    line = render_entry(event, tmp_path, timestamps=False)
    assert isinstance(line, Text) and "2 tensors, 1 optimizer(s), 1 LR scheduler(s) in 0.0 s" in line.plain, line.plain


def test_the_app_logs_the_schedules_a_rebuild_carried(tmp_path: Path) -> None:
    from workbench.frontends.tui.widgets.reload_log import render_entry
    from workbench.protocol.events import Rebuilt

    event = Rebuilt(ok=True, code_version=2, tensors_carried=2, optimizer_states_carried=1, schedulers_carried=1)
    line = render_entry(event, tmp_path, timestamps=False)
    assert "1 optimizer states, and 1 LR schedule(s) going on" in line.plain, line.plain
    quiet = render_entry(Rebuilt(ok=True, code_version=2), tmp_path, timestamps=False)
    assert "schedule" not in quiet.plain, quiet.plain


def test_a_sharded_snapshot_keeps_tensor_rates_as_numbers_and_says_when_a_state_cannot_be_kept() -> None:
    import json

    from workbench.engine.actions.schedulers import load_schedulers
    from workbench.engine.actions.sharded_snapshot import _facts_json

    kept = json.loads(_facts_json({"step": 3, "schedulers": {"s": {"base_lrs": [torch.tensor(0.5)]}}, "scheduler_types": {}}))
    assert kept["schedulers"] == {"s": {"base_lrs": [0.5]}}
    facts = json.loads(_facts_json({"step": 3, "schedulers": {"s": {"odd": object()}}, "scheduler_types": {"s": "x"}}))
    assert facts["schedulers"] == {} and "is not JSON" in facts["schedulers_error"]
    state, _ = setup_like()
    loaded, notes = load_schedulers({"sched": state["sched"]}, facts)
    said = ("sched (SequentialLR) is not in the snapshot (its state could not be written: object is not JSON): its "
            "schedule starts over, while the optimizer keeps the learning rate the snapshot has")
    assert loaded == 0 and notes == [said], notes


def test_a_partial_resume_says_the_schedules_start_over(tmp_path: Path) -> None:
    state, namespaces = setup_like()
    train(state, namespaces, 4)
    payload = load_snapshot(Path(write_snapshot(state, 4, 0, tmp_path, namespaces=namespaces).path))
    state, namespaces = setup_like()
    state["model"] = torch.nn.Linear(4, 2)  # no longer fits the snapshot: only what fits is loaded
    report = apply_snapshot(state, payload, tmp_path / "p.pt", partial=True, namespaces=namespaces)
    assert report.optimizers == report.schedulers == 0 and state["sched"].last_epoch == 0
    assert report.scheduler_notes == [
        "sched (SequentialLR) starts its schedule over: a partial resume loads no optimizer or scheduler state",
        "train.sched2 (StepLR) starts its schedule over: a partial resume loads no optimizer or scheduler state",
    ]


def test_a_scheduler_whose_state_dict_raises_is_carried_by_its_attributes() -> None:
    """torch's LambdaLR.state_dict() raises for a callable with __slots__ (it copies the callable's __dict__)."""

    class Warm:
        __slots__ = ("total",)

        def __init__(self, total: int) -> None:
            self.total = total

        def __call__(self, epoch: int) -> float:
            return min(1.0, (epoch + 1) / self.total)

    def made() -> tuple[dict[str, Any], tuple[()]]:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        return {"opt": opt, "sched": lr_scheduler.LambdaLR(opt, Warm(10))}, ()

    new, carried, notes = stepped_then_rebuilt(made, 4)
    assert (carried, notes) == (1, []) and new["sched"].last_epoch == 4
    new["opt"].step()
    new["sched"].step()
    assert new["opt"].param_groups[0]["lr"] == pytest.approx(0.06)  # the warm-up's step 5, as in the straight run


def test_a_scheduler_whose_state_does_not_load_starts_over_as_made_and_the_rebuild_stands() -> None:
    class Fragile(lr_scheduler.StepLR):
        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.last_epoch = 99  # half-way, then
            raise RuntimeError("no loading here")

    def made() -> tuple[dict[str, Any], tuple[()]]:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        return {"opt": opt, "sched": Fragile(opt, step_size=1, gamma=0.5)}, ()

    new, carried, notes = stepped_then_rebuilt(made, 3)
    assert carried == 0 and new["sched"].last_epoch == 0 and new["opt"].param_groups[0]["lr"] == 0.1
    assert notes == ["sched (Fragile) starts its schedule over, as setup() made it: the old one's state could not be "
                     "loaded (RuntimeError: no loading here) (the old one was at step 3)"], notes


def test_a_schedule_whose_settings_changed_goes_on_from_the_run_s_step_at_the_new_schedule_s_rate() -> None:
    """An edited `gamma` or `total_steps`, then R: the new schedule at the run's step, as a fresh start with the new
    code would have it there (not back in its warm-up, not the old schedule's rate)."""

    def made(gamma: float, total: int) -> dict[str, Any]:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
        other = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        return {"opt": opt, "step": lr_scheduler.StepLR(opt, step_size=2, gamma=gamma),
                "other": other, "cycle": lr_scheduler.OneCycleLR(other, max_lr=0.1, total_steps=total)}

    def stepped(state: dict[str, Any], steps: int) -> dict[str, Any]:
        for _ in range(steps):
            state["opt"].step()
            state["other"].step()
            state["step"].step()
            state["cycle"].step()
        return state

    old = made(0.5, 40)
    old_made = as_made(old, ())
    stepped(old, 7)
    new, _, carried, notes = rebuilt(old, (), old_made, lambda: (made(0.1, 80), ()))
    fresh = stepped(made(0.1, 80), 7)  # a fresh start with the new code, at the same step
    assert carried == 2 and new["step"].last_epoch == new["cycle"].last_epoch == 7
    for key in ("lr", "momentum"):
        assert new["opt"].param_groups[0][key] == pytest.approx(fresh["opt"].param_groups[0][key], rel=1e-12)
        assert new["other"].param_groups[0][key] == pytest.approx(fresh["other"].param_groups[0][key], rel=1e-12)
    assert notes == [
        "step (StepLR) goes on from its step 7 (step() called 7 times) with the new settings (gamma 0.5 -> 0.1): "
        "learning rate 0.1 as setup() made it, 0.0001 at its step 7 of the new schedule",
        "cycle (OneCycleLR) goes on from its step 7 (step() called 7 times) with the new settings (total_steps 40 -> "
        "80): learning rate 0.004 as setup() made it, 0.02432 at its step 7 of the new schedule",
    ], notes
    after = stepped(new, 5)
    fresh = stepped(fresh, 5)
    assert after["opt"].param_groups[0]["lr"] == pytest.approx(fresh["opt"].param_groups[0]["lr"], rel=1e-12)
    assert after["other"].param_groups[0]["lr"] == pytest.approx(fresh["other"].param_groups[0]["lr"], rel=1e-12)


def test_a_one_cycle_schedule_cut_shorter_than_the_run_starts_over_and_says_so() -> None:
    def made(total: int) -> dict[str, Any]:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        return {"opt": opt, "cycle": lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)}

    old = made(40)
    old_made = as_made(old, ())
    for _ in range(12):
        old["opt"].step()
        old["cycle"].step()
    new, _, carried, notes = rebuilt(old, (), old_made, lambda: (made(10), ()))
    assert carried == 0 and new["cycle"].last_epoch == 0 and new["opt"].param_groups[0]["lr"] == pytest.approx(0.004)
    assert len(notes) == 1 and notes[0].startswith("cycle (OneCycleLR) starts its schedule over") and (
        "its settings changed (total_steps 40 -> 10), and the new schedule has no rate at step 12 (ValueError: Tried "
        "to step 12 times" in notes[0]), notes


LAZY_GLOBAL = """\
import torch

OPT = SCHED = None


def setup(bench):
    torch.manual_seed(0)
    return {"model": torch.nn.Linear(4, 1)}


def step(state, bench):
    global OPT, SCHED
    if OPT is None:  # made on first use, as some trainers do: setup() never makes them
        OPT = torch.optim.SGD(state["model"].parameters(), lr=0.1)
        SCHED = torch.optim.lr_scheduler.StepLR(OPT, step_size=2, gamma=0.5)
    loss = state["model"](torch.ones(2, 4)).pow(2).mean()
    OPT.zero_grad()
    loss.backward()
    OPT.step()
    SCHED.step()
    return {"loss": loss, "lr": OPT.param_groups[0]["lr"]}
"""

LAZY_STATE = """\
import torch


def setup(bench):
    torch.manual_seed(0)
    return {"model": torch.nn.Linear(4, 1)}


def step(state, bench):
    if "opt" not in state:  # made on first use, as some trainers do: setup() never makes them
        state["opt"] = torch.optim.SGD(state["model"].parameters(), lr=0.1)
        state["sched"] = torch.optim.lr_scheduler.StepLR(state["opt"], step_size=2, gamma=0.5)
    loss = state["model"](torch.ones(2, 4)).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["sched"].step()
    return {"loss": loss, "lr": state["opt"].param_groups[0]["lr"]}
"""


@pytest.mark.parametrize("source", [LAZY_GLOBAL, LAZY_STATE], ids=["global", "state"])
def test_a_scheduler_step_makes_follows_its_optimizer_made_again_by_a_rebuild(tmp_path: Path, source: str) -> None:
    """Before, a global one kept stepping the discarded optimizer (the rate training used froze at 0.05) and one in the
    state was dropped while its optimizer was put back (the next step raised KeyError: 'sched')."""
    straight, after, rebuilt = straight_and_rebuilt(tmp_path, source, 5, 10)
    assert rebuilt.ok and any("an LR scheduler setup() does not make, now steps" in n for n in rebuilt.notes), rebuilt
    assert len({lr for _, lr in straight}) > 3, "the rate moves: the comparison means something"
    assert after == straight, [(k + 1, a, b) for k, (a, b) in enumerate(zip(straight, after)) if a != b]


def test_a_fingerprint_sees_an_edited_warm_up_and_reads_what_it_closes_over_only_so_far() -> None:
    from workbench.engine.schedule_settings import MAX_ITEMS, differences, fingerprint

    def made(divisor: str, rows: list[int]) -> lr_scheduler.LambdaLR:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        factory = eval(f"lambda rows: (lambda e: min(1.0, (e + 1) / {divisor}) + 0 * len(rows))")  # a file's warm-up
        return lr_scheduler.LambdaLR(opt, factory(rows))

    rows = list(range(1_000_000))
    old = fingerprint(made("10", rows))
    assert fingerprint(made("10", rows)) == old
    closed_over = old["lr_lambdas"][0]["closure"][0]
    assert len(closed_over) == MAX_ITEMS + 1 and closed_over[-1] == {"items": 1_000_000}  # its length, not its rows
    changed = differences(old, fingerprint(made("100", rows)))
    assert changed == ["lr_lambdas[0] (the code of <lambda>.<locals>.<lambda>)"], changed
