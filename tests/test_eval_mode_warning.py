"""A step that runs with the trained model in eval mode gets one warning per relapse; training goes on.

The session test is the bug as users write it: an `evaluate()` that calls
`model.eval()` and never `model.train()`. The unit tests pin down which modules
are watched and when a step counts as run in eval mode.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch
from rich.text import Text

from tests.conftest import is_event, save
from workbench.engine.eval_mode import EvalModeWatch, trained_modules
from workbench.protocol.events import Error, Evaluate
from workbench.frontends.tui.widgets.reload_log import render_entry

FORGETFUL = """\
import time

import torch


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    teacher = torch.nn.Linear(4, 1).eval().requires_grad_(False)  # in eval on purpose: never warned about
    return {"model": model, "teacher": teacher, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    time.sleep(0.005)
    x = torch.randn(8, 4)
    loss = ((state["model"](x) - state["teacher"](x)) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    bench.log(train_mode=state["model"].training)
    return loss


def evaluate(state, bench):
    state["model"].eval()
    with torch.no_grad():
        out = state["model"](torch.randn(8, 4)).mean().item()
    return {"val": out}
"""

FIXED = FORGETFUL.replace('    return {"val": out}\n', '    state["model"].train()\n    return {"val": out}\n')


def is_eval_warning(event) -> bool:
    return event.name == "error" and event.where == "eval mode"


def test_evaluate_that_forgets_train_warns_once_per_relapse_and_never_pauses(start_session):
    live = start_session({"train.py": FORGETFUL})
    live.wait_running(2)

    live.send(Evaluate())
    live.wait_for(is_event("evaluate"))
    warning = live.wait_for(is_eval_warning, what="the eval-mode warning")
    assert 'state["model"]' in warning.message and "teacher" not in warning.message
    assert "evaluate" in warning.message and 'state["model"].train()' in warning.message and "start of step" in warning.message
    assert warning.is_warning and warning.traceback is None
    later = live.events.steps(5)
    assert all(e.scalars["train_mode"] == 0.0 for e in later), "the model stays in eval mode: nothing switched it back"
    assert len([e for e in live.events.of("error") if is_eval_warning(e)]) == 1, "one warning, not one per step"
    assert not live.events.of("paused"), "a warning never pauses training"

    save(live.entry, FIXED)
    live.wait_for(is_event("reload", ok=True, changed=("evaluate",)))
    live.send(Evaluate())
    live.wait_for(is_event("evaluate"))
    live.events.steps(3, lambda e: e.scalars["train_mode"] == 1.0)  # seen back in train mode: armed again
    assert len([e for e in live.events.of("error") if is_eval_warning(e)]) == 1

    save(live.entry, FORGETFUL)  # the bug comes back
    live.wait_for(is_event("reload", ok=True, changed=("evaluate",)))
    live.send(Evaluate())
    live.wait_for(is_event("evaluate"))
    live.wait_for(is_eval_warning, what="a second warning after the relapse")
    live.events.steps(3)
    assert len([e for e in live.events.of("error") if is_eval_warning(e)]) == 2
    assert not live.events.of("paused")


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))


def test_watched_modules_are_the_ones_an_optimizer_trains():
    model, teacher, ema = _net(), _net().eval(), _net().eval()  # the EMA copy still requires grad
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "teacher": teacher, "ema": ema, "opt": opt}
    assert [label for label, _ in trained_modules(state)] == ['state["model"]']
    # A hand-written update (no optimizer in the state): modules with parameters that require grad.
    teacher.requires_grad_(False)
    assert [label for label, _ in trained_modules({"model": model, "teacher": teacher})] == ['state["model"]']
    assert [label for label, _ in trained_modules(model)] == ["state"]


def test_a_step_counts_as_run_in_eval_mode_only_if_it_starts_and_ends_in_it():
    model = _net()
    watch = EvalModeWatch()
    watch.refresh({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)})

    model.eval()  # evaluate() left it in eval, and step() starts with model.train(): fine
    started = watch.in_eval()
    model.train()
    assert watch.after_step(started, 1) is None

    started = watch.in_eval()  # step() itself ends by evaluating: the next step will tell
    model.eval()
    assert watch.after_step(started, 2) is None
    warning = watch.after_step(watch.in_eval(), 3)
    assert isinstance(warning, Error) and warning.where == "eval mode" and "step 3" in warning.message
    assert watch.after_step(watch.in_eval(), 4) is None  # once per relapse


def test_the_watch_never_keeps_a_model_alive():
    """A rebuild frees the old state before the watch is refreshed: the watch must not pin it."""
    model = _net()
    watch = EvalModeWatch()
    watch.refresh({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)})
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    assert watch.after_step(watch.in_eval(), 1) is None


def test_the_reload_log_shows_it_as_a_warning(tmp_path: Path):
    line = render_entry(Error(where="eval mode", message='step 3 ran with state["model"] in eval mode'), tmp_path, timestamps=False)
    assert isinstance(line, Text) and line.plain.startswith("WARNING eval mode step 3 ran with")
    assert "training paused" not in line.plain


def test_a_step_that_trains_in_training_mode_between_evaluations_is_not_warned_about():
    """pytorch/examples' GCN loop: `model.train()` first, `model.eval()` (its test()) last, so every step starts and
    ends in eval mode while its training forward runs in training mode: it was warned about every time, falsely."""
    model = _net()
    watch = EvalModeWatch()
    watch.refresh({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)})
    model.eval()
    for step in (1, 2, 3):
        started = watch.starting()
        model.train()
        model(torch.ones(3, 2))
        model.eval()
        model(torch.ones(3, 2))  # its test()
        assert watch.after_step(started, step) is None, step
    started = watch.starting()  # a step whose forward runs in eval mode only: warned, as before
    model(torch.ones(3, 2))
    warning = watch.after_step(started, 4)
    assert isinstance(warning, Error) and "step 4" in warning.message
    model.train()
    watch.starting()
    assert not model._forward_pre_hooks, "the probe goes once a step starts in training mode"
