"""Closures, lambdas, hooks and generators that live objects hold: patched, or reported."""

from __future__ import annotations

from tests.conftest import is_event, save
from workbench.protocol.events import Rebuild

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


SCHEDULED_PY = ADAMW_PY.replace("LR = 0.01  # equal to AdamW's default weight_decay", "LR = 0.01\nWARMUP = 4") + """

def lr_at(it):  # nanoGPT's shape: the schedule reads the constant, step() writes the result into every group
    return LR * min(1.0, (it + 1) / WARMUP)


def scheduled_step(state, bench):
    for group in state["opt"].param_groups:
        group["lr"] = lr_at(bench.step)
    return step(state, bench)
"""
SCHEDULED_PY = SCHEDULED_PY.replace("def step(state, bench):", "def plain_step(state, bench):").replace(
    "    return step(state, bench)\n", "    return plain_step(state, bench)\n").replace("def scheduled_step(", "def step(")


def test_no_note_says_an_optimizer_keeps_its_lr_when_the_projects_code_sets_it_every_step(start_session):
    """All three trainers ported from pytorch/examples and nanoGPT set param_group['lr'] in step(); the note said the
    optimizer "keeps that value" on every save of the LR anyway (and setup()'s "what it built keeps the old value")."""
    live = start_session({"train.py": SCHEDULED_PY})
    live.wait_running(5)
    save(live.entry, SCHEDULED_PY.replace("LR = 0.01", "LR = 0.05"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("LR",)
    assert not [note for note in reload.notes if "LR" in note], reload.notes
    live.events.steps(2, lambda e: e.code_version == 1)
    assert live.session.worker.user_state["opt"].param_groups[0]["lr"] == 0.05  # what the note would have denied


def test_where_code_sets_finds_the_first_subscript_assignment_of_the_key(tmp_path):
    from workbench.engine.hotswap.sets_in_code import where_code_sets

    source = tmp_path / "train.py"
    source.write_text("x = {}\nx['momentum'] = 1\n\ndef f(opt):\n    for g in opt.param_groups:\n        g['lr'] *= 0.5\n"
                      "    a, opt.param_groups[0]['lr'] = 1, 2\n")
    namespaces = [("train", {"__file__": str(source)})]
    assert where_code_sets(namespaces, "lr") == "train.py:6"
    assert where_code_sets(namespaces, "weight_decay") is None
    assert where_code_sets([("x", {"__file__": None}), ("y", {})], "lr") is None


GLOBAL_GENERATOR_PY = """\
import torch


def cycle(rows):
    while True:
        for row in rows:
            yield row


batches = cycle([1.0, 2.0, 3.0])


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "row": next(batches)}
"""


def test_a_running_generator_a_module_statement_made_is_said_to_keep_the_old_code_through_r(start_session):
    """An x-transformers trainer, ported: `train_loader = cycle(DataLoader(...))` at the top of the script; an edit of
    cycle() was said to keep the old code "until it is created again (R rebuilds)", and neither R nor x made it again."""
    live = start_session({"train.py": GLOBAL_GENERATOR_PY})
    live.wait_running(2)
    save(live.entry, GLOBAL_GENERATOR_PY.replace("yield row", "yield row * 10"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    said = [note for note in reload.notes if "running generator made by the old cycle() at import" in note]
    assert said and "R makes again what setup() makes" in said[0] and "press x, or restart" in said[0], reload.notes
    assert not any("(R rebuilds)" in note for note in reload.notes), reload.notes
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild"), timeout=30).ok
    rows = [e.scalars["row"] for e in live.events.steps(3)]
    assert all(row < 10 for row in rows), rows  # as said: R did not make it again
