"""A name deleted from the file leaves the live module, as a restart would leave it out, unless a live object
still holds it: then it stays, and the reload's note names that object.

Every test runs a real session on a tiny project and saves real edits.
"""

from __future__ import annotations

import types

from conftest import Live, is_event, line_of, save
from workbench.protocol.events import Rollback

TRAIN_PY = """\
import time

import torch
from torch.utils.data import DataLoader

SCALE = 1.0


def helper():
    return 1.0


def unused():
    return 2.0


def make_batch(items):
    return torch.stack(items)


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, value):
        return value * self.k


class Unused:
    def value(self):
        return 3.0


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader([torch.randn(4) for _ in range(8)], batch_size=8, collate_fn=make_batch)
    return {"model": model, "opt": opt, "fn": unused, "loader": loader, "scaler": Scaler(1.0)}


def step(state, bench):
    time.sleep(0.005)
    x = next(iter(state["loader"]))
    y = x.sum(dim=1, keepdim=True)
    loss = ((state["model"](x) - y) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return {"loss": loss, "h": helper(), "scale": SCALE}
"""

# The same project where setup() keeps nothing of this file but the model and optimizer: every helper is free.
FREE_PY = (
    TRAIN_PY.replace('"fn": unused, ', "")
    .replace('"scaler": Scaler(1.0)', '"scaler": None')
    .replace(", collate_fn=make_batch", "")
)


def without(source: str, *definitions: str) -> str:
    """`source` without the top-level `def NAME`/`class NAME` blocks named (each ends at the next blank pair)."""
    for name in definitions:
        start = next(source.index(f"{kind} {name}") for kind in ("def", "class") if f"{kind} {name}" in source)
        end = source.index("\n\n\n", start) + 3
        source = source[:start] + source[end:]
    return source


def train_module(live: Live) -> types.ModuleType:
    return next(m for m in live.session.project.modules().values() if m.__name__ == "train")


def test_a_deleted_helper_nothing_calls_is_removed_and_training_goes_on(start_session) -> None:
    live = start_session({"train.py": FREE_PY})
    live.wait_running(2)
    module = train_module(live)
    assert callable(module.unused) and isinstance(module.Unused, type)

    save(live.entry, without(FREE_PY, "unused", "Unused"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert "removed unused (deleted from the file)" in reload.notes, reload.notes
    assert "removed Unused (deleted from the file)" in reload.notes, reload.notes
    assert set(reload.changed) == {"unused (removed)", "Unused (removed)"}
    assert reload.code_version == 1
    assert "unused" not in vars(module) and "Unused" not in vars(module)
    steps = live.events.steps(3, lambda e: e.code_version == 1)
    assert all(e.scalars["h"] == 1.0 for e in steps)


def test_a_deleted_helper_step_still_calls_raises_name_error_and_saving_it_back_resumes(start_session) -> None:
    live = start_session({"train.py": FREE_PY})
    live.wait_running(2)
    state = live.session.worker.user_state
    model, opt = state["model"], state["opt"]

    broken = without(FREE_PY, "helper")
    save(live.entry, broken)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and "removed helper (deleted from the file)" in reload.notes, reload
    error = live.wait_for(is_event("error", where="step"))
    assert error.message == "step() raised NameError: name 'helper' is not defined"
    assert (error.file, error.line) == ("train.py", line_of(broken, '"h": helper()'))
    paused = live.wait_for(is_event("paused"))
    assert paused.reason == "error"
    assert live.session.worker.user_state["model"] is model and live.session.worker.user_state["opt"] is opt

    save(live.entry, FREE_PY)
    back = live.wait_for(is_event("reload", file="train.py"))
    assert back.ok and back.changed == ("helper",), back
    live.wait_for(is_event("resumed", reason="reload"))
    steps = live.events.steps(2)
    assert all(e.scalars["h"] == 1.0 for e in steps)
    assert live.session.worker.user_state["model"] is model and live.session.worker.user_state["opt"] is opt


def test_a_deleted_function_a_live_object_holds_is_kept_and_the_note_names_it(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    module = train_module(live)
    unused, make_batch = module.unused, module.make_batch

    save(live.entry, without(TRAIN_PY, "unused", "make_batch"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert (
        "kept train.unused (deleted from the file): state['fn'] still uses it; it goes at the first save of the file "
        "after that object is gone (after a rebuild whose setup() no longer makes it, say)"
    ) in reload.notes, reload.notes
    assert any(
        note.startswith("kept train.make_batch (deleted from the file): state['loader'].collate_fn still uses it")
        for note in reload.notes
    ), reload.notes
    assert not any(note.startswith("removed") for note in reload.notes), reload.notes
    assert reload.changed == ()
    assert module.unused is unused and module.make_batch is make_batch
    live.events.steps(3)  # the loader still batches with it

    # Once nothing holds it, the next save of the file removes it.
    live.session.worker.user_state.pop("fn")
    save(live.entry, without(TRAIN_PY, "unused", "make_batch").replace("SCALE = 1.0", "SCALE = 2.0"))
    later = live.wait_for(is_event("reload", file="train.py"))
    assert "removed unused (deleted from the file earlier; no live object holds it now)" in later.notes, later.notes
    assert not any("make_batch" in note for note in later.notes), later.notes  # still held: said once, not again
    assert "unused" not in vars(module) and module.make_batch is make_batch
    assert live.events.steps(2, lambda e: e.scalars["scale"] == 2.0)


def test_a_deleted_class_with_a_live_instance_is_kept_and_the_note_names_the_instance(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    module = train_module(live)
    scaler_class = module.Scaler

    save(live.entry, without(TRAIN_PY, "Scaler", "Unused"))  # setup() still names it: a rebuild would fail
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert any(
        note.startswith("kept train.Scaler (deleted from the file): the state's scaler is an instance of it;")
        for note in reload.notes
    ), reload.notes
    assert "removed Unused (deleted from the file)" in reload.notes, reload.notes
    assert module.Scaler is scaler_class and "Unused" not in vars(module)
    assert type(live.session.worker.user_state["scaler"]) is scaler_class
    live.events.steps(2)


def test_rollback_of_the_deleting_version_puts_the_name_back(start_session) -> None:
    live = start_session({"train.py": FREE_PY})
    live.wait_running(2)
    module = train_module(live)
    unused, unused_class = module.unused, module.Unused

    save(live.entry, without(FREE_PY, "unused", "Unused"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.code_version == 1 and "unused" not in vars(module), reload

    live.send(Rollback())
    back = live.wait_for(is_event("reload", code_version=2))
    assert back.ok and set(back.changed) == {"unused (removed)", "Unused (removed)"}, back
    assert "unused, Unused are back in the module (the rolled-back save removed them)" in back.notes, back.notes
    assert module.unused is unused and module.Unused is unused_class
    assert live.session.reloader.history == []
    live.events.steps(2, lambda e: e.code_version == 2)


def test_names_the_file_still_binds_are_not_removed_and_blocks_are_kept_to_be_safe(start_session) -> None:
    source = FREE_PY.replace(
        "def setup(bench):",
        'if SCALE > 0:\n    def guarded():\n        return 4.0\n\n\ntry:\n    OPTIONAL = 5.0\nexcept Exception:\n'
        "    OPTIONAL = None\n\nTABLE = dict(a=1.0)\n\n\ndef setup(bench):",
    )
    live = start_session({"train.py": source})
    live.wait_running(2)
    module = train_module(live)
    unused = module.unused

    # `unused` moves under an `if` (still bound: stays); the `try` block and a line that calls code go (kept, said).
    edited = without(source, "unused").replace(
        "if SCALE > 0:\n", "if SCALE > 0:\n    def unused():\n        return 2.0\n\n"
    )
    edited = edited.replace("try:\n    OPTIONAL = 5.0\nexcept Exception:\n    OPTIONAL = None\n\nTABLE = dict(a=1.0)\n", "")
    save(live.entry, edited)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert not any("unused" in note for note in reload.notes), reload.notes
    assert "unused" in vars(module)
    assert any(
        note.startswith("kept OPTIONAL (deleted from the file): it was bound inside `try:`") for note in reload.notes
    ), reload.notes
    assert any(
        note.startswith("kept TABLE (deleted from the file): `TABLE = dict(a=1.0)` made it by calling code")
        for note in reload.notes
    ), reload.notes
    assert module.OPTIONAL == 5.0 and module.TABLE == {"a": 1.0} and module.unused is unused
    live.events.steps(2)
