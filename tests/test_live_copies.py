"""Closures, lambdas, hooks and generators that live objects hold: patched, or reported."""

from __future__ import annotations

from tests.conftest import is_event, save

TRAIN_PY = """\
import time
import torch

LR = 0.01
ACT = lambda t: t * 1.0


def make_scaler(factor):
    def scaled(x):
        return x * factor
    return scaled


def make_hook(store):
    def hook(module, inputs, output):
        store["hook"] = 1.0
    return hook


def numbers():
    n = 0
    while True:
        n += 1
        yield n


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    seen = {}
    model.register_forward_hook(make_hook(seen))
    return {
        "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=LR),
        "scale": make_scaler(2.0),
        "act": ACT,
        "seen": seen,
        "numbers": numbers(),
    }


def step(state, bench):
    time.sleep(0.003)
    x = torch.randn(8, 4)
    loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {
        "loss": loss,
        "scaled": state["scale"](1.0),
        "act": float(state["act"](torch.ones(1))),
        "hook": state["seen"].get("hook", 0.0),
        "n": float(next(state["numbers"])),
    }
"""


def test_closure_made_in_setup_gets_the_new_nested_code(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    scaler = live.session.worker.user_state["scale"]
    save(live.entry, TRAIN_PY.replace("return x * factor", "return x * factor + 1"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("make_scaler",)
    assert any("updated 1 live closure" in note for note in reload.notes), reload.notes
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["scaled"] == 3.0
    assert live.session.worker.user_state["scale"] is scaler


def test_closure_whose_captured_variables_change_is_reported_not_patched(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    changed = TRAIN_PY.replace(
        "    def scaled(x):\n        return x * factor\n",
        "    offset = 1\n\n    def scaled(x):\n        return x * factor + offset\n",
    )
    save(live.entry, changed)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert any("variables these closures capture changed" in n and "state['scale']" in n for n in reload.notes), reload.notes
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["scaled"] == 2.0


def test_lambda_stored_in_the_state_is_patched_in_place(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    act = live.session.worker.user_state["act"]
    save(live.entry, TRAIN_PY.replace("ACT = lambda t: t * 1.0", "ACT = lambda t: t * 5.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("ACT",)
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["act"] == 5.0
    assert live.session.worker.user_state["act"] is act


def test_registered_forward_hook_closure_gets_the_new_code(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY.replace('store["hook"] = 1.0', 'store["hook"] = 7.0'))
    live.wait_for(is_event("reload", file="train.py"))
    assert live.events.steps(3, lambda e: e.code_version == 1)[-1].scalars["hook"] == 7.0


def test_running_generator_keeps_old_code_and_says_so(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY.replace("n += 1", "n += 100"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("numbers",)
    assert any("state['numbers'] is a running generator" in note for note in reload.notes), reload.notes
    steps = live.events.steps(3, lambda e: e.code_version == 1)
    assert steps[1].scalars["n"] - steps[0].scalars["n"] == 1.0, "the generator cannot switch code mid-run"


def test_optimizer_built_from_a_changed_constant_is_named(start_session):
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    save(live.entry, TRAIN_PY.replace("LR = 0.01", "LR = 0.05"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("LR",)
    assert any("opt was built with LR = 0.01" in note and "0.05" in note for note in reload.notes), reload.notes


ADAMW_PY = """
import torch

LR = 0.01  # equal to AdamW's default weight_decay

def setup(bench):
    model = torch.nn.Linear(2, 1)
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=LR)}

def step(state, bench):
    loss = state["model"](torch.ones(1, 2)).pow(2).sum()
    loss.backward(); state["opt"].step(); state["opt"].zero_grad()
    return loss
"""


def test_an_equal_hyperparameter_with_another_name_is_not_blamed(start_session):
    live = start_session({"train.py": ADAMW_PY})
    live.wait_running(2)
    save(live.entry, ADAMW_PY.replace("LR = 0.01", "LR = 0.003"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    notes = [note for note in reload.notes if "was built with" in note]
    assert len(notes) == 1 and "['lr']" in notes[0] and "weight_decay" not in notes[0], reload.notes
