"""Issue 13, "What was seen": each case found by porting real trainers, as a test that failed before its fix.

Real sessions on small projects in tmp dirs (see conftest.py): save, wait for the reload event,
run steps, and check the code that runs is the code on disk, or the event says what is not.
"""

from __future__ import annotations

import gc
import weakref

from conftest import is_event, save

# --------------------------------------------------------------------------- closures after a shifted save

CLOSURE_PY = """\
import torch


def make_scale():
    def f(x):
        return x * 2.0
    return f


def make_counter():
    def gen():
        while True:
            yield 1.0
    return gen()


def setup(bench):
    return {"scale": make_scale(), "gen": make_counter(), "model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "closure": state["scale"](1.0), "gen": next(state["gen"])}
"""


def test_closure_edit_after_a_line_shift_reaches_the_live_closure(start_session) -> None:
    live = start_session({"train.py": CLOSURE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    shifted = "# a comment that moves every function down\n\n" + CLOSURE_PY
    save(live.entry, shifted)
    live.wait_for(is_event("reload", file="train.py"))
    save(live.entry, shifted.replace("x * 2.0", "x * 3.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and "make_scale" in reload.changed, reload
    assert any("1 live closure" in note for note in reload.notes), reload.notes
    live.send(__import__("workbench.events", fromlist=["StepOnce"]).StepOnce())
    step = live.wait_for(is_event("step"))
    assert step.scalars["closure"] == 3.0


def test_running_generator_is_named_after_a_line_shift(start_session) -> None:
    live = start_session({"train.py": CLOSURE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    shifted = "# a comment\n" + CLOSURE_PY
    save(live.entry, shifted)
    live.wait_for(is_event("reload", file="train.py"))
    save(live.entry, shifted.replace("yield 1.0", "yield 2.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert any("running generator" in note and "make_counter" in note for note in reload.notes), reload.notes
