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


# --------------------------------------------------------------------------- models in module globals

GLOBAL_MODEL_PY = """\
import torch

MODEL = None
OPT = None
WIDTH = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, 1)
        self.tag = 0

    def forward(self, x):
        return self.fc(x)


def setup(bench):
    global MODEL, OPT
    MODEL = Net()
    OPT = torch.optim.AdamW(MODEL.parameters(), lr=1e-3)
    return {"model": MODEL, "opt": OPT}


def step(state, bench):
    loss = MODEL(torch.ones(2, WIDTH)).pow(2).mean()
    loss.backward()
    OPT.step()
    OPT.zero_grad(set_to_none=True)
    return loss
"""


def test_rebuilds_leave_one_model_alive_when_setup_keeps_it_in_a_module_global(start_session) -> None:
    from workbench.events import Rebuild, RunCleanup

    live = start_session({"train.py": GLOBAL_MODEL_PY})
    live.wait_running(2)
    models = [weakref.ref(live.session.worker.user_state["model"])]
    source = GLOBAL_MODEL_PY
    for n in range(1, 4):
        source = source.replace(f"self.tag = {n - 1}", f"self.tag = {n}")
        save(live.entry, source)
        held = live.wait_for(is_event("reload", file="train.py"))
        assert held.needs_rebuild, held
        live.send(Rebuild())
        assert live.wait_for(is_event("rebuild")).ok
        live.send(RunCleanup())
        live.wait_for(is_event("cleanup"))
        live.events.steps(1)
        models.append(weakref.ref(live.session.worker.user_state["model"]))
    gc.collect()
    assert live.session.project.module.MODEL.tag == 3
    alive = [n for n, ref in enumerate(models) if ref() is not None]
    assert alive == [3], f"models alive after three rebuilds (0 is setup's): {alive}"
