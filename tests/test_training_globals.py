"""Counters a script-style trainer keeps in module globals are in its snapshots and come back on resume.

Found porting nanoGPT's train.py: its step() counts `iter_num` in a global and sets the learning rate from it.
Resumed from a snapshot, setup() set `iter_num = 0` again and the schedule warmed up from the start (lr 1e-5
instead of 1e-3 at step 167), while the resume event said everything was loaded. Real sessions on small
projects (see conftest.py), then a second session resumed from the first one's snapshot.
"""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import is_event, make_project, open_session, save
from workbench.engine.actions.snapshot import load_snapshot
from workbench.engine.training_globals import TrainingGlobals, put_back
from workbench.protocol.events import Evaluate, Pause, StepOnce, TakeSnapshot

TRAIN_PY = """\
from pathlib import Path

import torch

LR = 0.1
best_val = 1e9
phase = "warmup"


def setup(bench):
    global model, iter_num, X
    iter_num = 0
    model = torch.nn.Linear(2, 1)
    X = torch.ones(4, 2)
    return {"opt": torch.optim.SGD(model.parameters(), lr=LR)}


def step(state, bench):
    global iter_num, X, phase
    iter_num += 1
    if iter_num > 3:
        phase = "decay"
    X = X + 0.0  # a tensor global that changes every step: not a counter, not kept
    loss = model(X).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "iter_num": float(iter_num)}


def evaluate(state, bench):
    global best_val
    best_val = min(best_val, 0.5)
    return {"val_loss": 0.5}
"""


def test_a_snapshot_keeps_what_training_changed_in_globals_and_a_resume_puts_it_back(start_session, tmp_path) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(3)
    save(live.entry, TRAIN_PY.replace("LR = 0.1\n", "LR = 0.2\n"))  # an edited constant is the file's: not kept
    assert live.wait_for(is_event("reload", file="train.py")).ok
    live.send(Evaluate())
    live.wait_for(is_event("evaluate"), timeout=30)
    live.send(Pause())
    live.wait_for(is_event("paused"))
    live.send(TakeSnapshot())
    taken = live.wait_for(is_event("snapshot"), timeout=30)
    kept = load_snapshot(Path(taken.path))["globals"]
    assert kept == {"train.iter_num": taken.step, "train.best_val": 0.5, "train.phase": "decay"}, kept

    root = make_project(tmp_path, {"train.py": TRAIN_PY}, folder="resumed")
    with open_session(root / "train.py", resume=Path(taken.path)) as resumed:
        loaded = resumed.wait_for(is_event("resume"), timeout=30)
        assert loaded.ok, loaded
        note = next(n for n in loaded.notes if n.startswith("put back from the snapshot"))
        assert f"train.iter_num = {taken.step}" in note and "train.best_val = 0.5" in note and "train.phase = 'decay'" in note
        first = resumed.events.steps(1)[0]
        assert first.step == taken.step + 1 and first.scalars["iter_num"] == taken.step + 1, "the count goes on"


def test_only_plain_values_changed_since_setup_and_not_bound_by_a_save_are_kept() -> None:
    namespace = {"__name__": "train", "n": 0, "lr": 0.1, "flag": False, "t": torch.zeros(1), "nan": float("nan"),
                 "long": "x" * 1000}
    globals_ = TrainingGlobals()
    globals_.mark([("train", namespace)])
    assert globals_.changed([("train", namespace)], {}) == {}, "nothing changed yet (NaN equals itself here)"
    namespace.update(n=5, lr=0.2, flag=True, t=torch.ones(1), long="y" * 1000, new_count=1)
    assert globals_.changed([("train", namespace)], {"train": {"lr"}}) == {"train.n": 5, "train.flag": True,
                                                                          "train.new_count": 1}
    other = {"n": torch.zeros(1)}
    done, left = put_back({"train.n": 5, "gone.k": 1, "other.n": 3}, [("train", namespace), ("other", other)])
    assert done == ["train.n = 5"] and namespace["n"] == 5
    assert left == ["gone.k (module gone is not loaded)", "other.n (now a Tensor, not a int)"]


def test_a_global_that_starts_as_none_is_put_back_as_training_left_it() -> None:
    """word_language_model's `best_val_loss = None` becomes a float at the first epoch's end: a resume that left
    it None would take the next epoch's loss, however bad, for the best and save over the best model."""
    namespace = {"__name__": "train", "best_val_loss": None, "model": torch.nn.Linear(1, 1)}
    globals_ = TrainingGlobals()
    globals_.mark([("train", namespace)])
    namespace["best_val_loss"] = 5.97
    saved = globals_.changed([("train", namespace)], {})
    assert saved == {"train.best_val_loss": 5.97}
    fresh = {"__name__": "train", "best_val_loss": None, "model": torch.nn.Linear(1, 1)}
    done, left = put_back({**saved, "train.model": 1.0}, [("train", fresh)])
    assert done == ["train.best_val_loss = 5.97"] and fresh["best_val_loss"] == 5.97
    assert left == ["train.model (now a Linear, not a float)"], "a global holding an object is never overwritten"


STATE_COUNTER = """\
import torch


def setup(bench):
    model = torch.nn.Linear(2, 1)
    return dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1), model=model, step=0, warmup=3, phase="warm")


def step(state, bench):
    state["step"] += 1  # score_sde_pytorch's run_lib: its LR warm-up reads state['step']
    if state["step"] > state["warmup"]:
        state["phase"] = "main"
    loss = state["model"](torch.ones(4, 2)).pow(2).mean()
    loss.backward()
    state["optimizer"].step()
    state["optimizer"].zero_grad()
    return {"loss": loss, "count": float(state["step"])}
"""


def test_a_plain_value_of_setups_state_dict_that_training_changed_is_kept_and_put_back(tmp_path: Path) -> None:
    """score_sde_pytorch returns `state = dict(optimizer, model, ema, step=0)` and counts state['step']: a resume
    began it at 0 again, so its warm-up started over. A value setup() made and training left alone is not kept."""
    from conftest import snapshot_after

    snapshot = snapshot_after(tmp_path, STATE_COUNTER, 5)
    assert load_snapshot(snapshot)["globals"] == {"setup().step": 5, "setup().phase": "main"}
    root = make_project(tmp_path, {"train.py": STATE_COUNTER}, folder="resumed")
    with open_session(root / "train.py", resume=snapshot) as resumed:
        loaded = resumed.wait_for(is_event("resume"), timeout=30)
        assert ("put back from the snapshot (plain values of setup()'s state that training changed): state['step'] = 5, "
                "state['phase'] = 'main'") in loaded.notes, loaded.notes
        first = resumed.events.steps(1)[0]
        assert first.step == 6 and first.scalars["count"] == 6, "the count goes on"


def test_a_rebuild_gives_setups_state_the_plain_values_training_reached_unless_setup_now_starts_them_elsewhere(
        start_session) -> None:
    from workbench.protocol.events import Rebuild

    live = start_session({"train.py": STATE_COUNTER})
    live.wait_running(5)  # the pause lands after step 5 at the earliest: past the warm-up, `phase` is "main"
    live.send(Pause())
    paused = live.wait_for(is_event("paused"))
    save(live.entry, STATE_COUNTER.replace("warmup=3", "warmup=2"))  # an edited start value is the new code's
    live.wait_for(is_event("reload", file="train.py"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
    assert rebuilt.ok and (f"carried over (plain values of the state that training changed, which setup() made again "
                           f"as they began): state['step'] = {paused.step}, state['phase'] = 'main'") in rebuilt.notes, rebuilt
    assert not any("warmup" in n for n in rebuilt.notes), rebuilt.notes


def test_state_values_are_one_more_namespace_that_no_module_can_be_named() -> None:
    from workbench.engine.training_globals import STATE, carry_state, state_namespace

    state = {"step": 0, "model": torch.nn.Linear(1, 1), 3: 1, "a.b": 2}
    globals_ = TrainingGlobals()
    globals_.mark([("train", {"n": 0}), *state_namespace(state)])
    state.update({"step": 7, 3: 4, "a.b": 5})
    assert globals_.changed([("train", {"n": 0}), *state_namespace(state)], {}) == {f"{STATE}.step": 7, f"{STATE}.a.b": 5}, "str keys"
    assert state_namespace([1, 2]) == [], "a state that is no dict has no values by name"
    again = {"step": 0, "model": torch.nn.Linear(1, 1)}
    assert carry_state(state, again, globals_) == [
        "carried over (plain values of the state that training changed, which setup() made again as they began): "
        "state['step'] = 7"] and again["step"] == 7


def test_after_a_rebuild_the_carried_values_are_still_training_state_for_snapshots_and_the_next_rebuild() -> None:
    """The baseline stays what setup() made: a snapshot right after a rebuild kept no count (the carried value was
    taken for setup()'s), and a second rebuild dropped it silently."""
    from workbench.engine.training_globals import STATE, carry_state, state_namespace

    globals_ = TrainingGlobals()
    state = {"step": 0, "epoch": 0, "global-step": 0}
    globals_.mark(state_namespace(state))
    state.update({"step": 1500, "epoch": 3, "global-step": 1500})
    for _ in range(2):  # two rebuilds in a row
        again = {"step": 0, "epoch": 0, "global-step": 0}
        made = globals_.state_values(again)
        assert carry_state(state, again, globals_) == [
            "carried over (plain values of the state that training changed, which setup() made again as they began): "
            "state['step'] = 1500, state['epoch'] = 3, state['global-step'] = 1500"]
        globals_.mark(state_namespace(again), made)
        assert globals_.changed(state_namespace(again), {}) == {
            f"{STATE}.step": 1500, f"{STATE}.epoch": 3, f"{STATE}.global-step": 1500}, "kept by the next snapshot"
        state = again
    done, _ = put_back({f"{STATE}.global-step": 7}, state_namespace(state))
    assert done == ["state['global-step'] = 7"] and state["global-step"] == 7, "a key that is no name, by its own name"


def test_a_rebuild_gives_a_value_setup_starts_as_none_what_training_set_it_to() -> None:
    """`state = dict(best_loss=None)` lowered by step(): a rebuild whose setup() starts it as None again left it None
    (the baseline held plain values only), so the next evaluation took any loss for the best."""
    from workbench.engine.training_globals import STATE, carry_state, state_namespace

    globals_ = TrainingGlobals()
    state = {"best_loss": None, "step": 0, "note": None}
    globals_.mark(state_namespace(state))
    state.update({"best_loss": 2.25, "step": 40})
    assert globals_.changed(state_namespace(state), {}) == {f"{STATE}.best_loss": 2.25, f"{STATE}.step": 40}
    again = {"best_loss": None, "step": 0, "note": None}
    assert carry_state(state, again, globals_) == [
        "carried over (plain values of the state that training changed, which setup() made again as they began): "
        "state['best_loss'] = 2.25, state['step'] = 40"] and again == {"best_loss": 2.25, "step": 40, "note": None}
    edited = {"best_loss": 9.0, "step": 0}
    carry_state(state, edited, globals_)
    assert edited["best_loss"] == 9.0, "a start value the new setup() changed is the new code's"


TRAINER_COUNTER = """\
import torch


class Trainer:
    \"\"\"minGPT's shape: the trainer counts its own iterations, and a callback reads the count.\"\"\"

    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.iter_num = 0
        self.best = None
        self.label = "warm"

    def run_iter(self):
        loss = self.model(torch.ones(4, 2)).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.iter_num += 1
        value = float(loss.detach())
        self.best = value if self.best is None else min(self.best, value)
        return loss


def setup(bench):
    model = torch.nn.Linear(2, 1)
    return {"model": model, "trainer": Trainer(model)}


def step(state, bench):
    loss = state["trainer"].run_iter()
    return {"loss": loss, "count": float(state["trainer"].iter_num)}
"""


def test_a_counter_of_a_project_object_in_the_state_is_kept_put_back_and_carried(tmp_path: Path, start_session) -> None:
    """minGPT, ported: `trainer.iter_num` began at 0 again after a resume and after a rebuild, with no note, and its
    callback's `iter_num % 500 == 0` sampling drew from the random generator again: the run went apart from the one
    that never stopped. A value the object keeps as setup() made it (`label`) is not kept."""
    from conftest import snapshot_after
    from workbench.protocol.events import Rebuild

    snapshot = snapshot_after(tmp_path, TRAINER_COUNTER, 5)
    kept = load_snapshot(snapshot)["globals"]
    assert kept["state['trainer'].iter_num"] == 5 and isinstance(kept["state['trainer'].best"], float), kept
    assert "state['trainer'].label" not in kept
    root = make_project(tmp_path, {"train.py": TRAINER_COUNTER}, folder="resumed")
    with open_session(root / "train.py", resume=snapshot) as resumed:
        loaded = resumed.wait_for(is_event("resume"), timeout=30)
        assert any(note.startswith("put back from the snapshot (plain values of setup()'s state that training "
                                   "changed): state['trainer'].iter_num = 5, state['trainer'].best = ")
                   for note in loaded.notes), loaded.notes
        first = resumed.events.steps(1)[0]
        assert first.step == 6 and first.scalars["count"] == 6, "the count goes on"

    live = start_session({"train.py": TRAINER_COUNTER})
    live.wait_running(3)
    live.send(Pause())
    paused = live.wait_for(is_event("paused"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
    carried = ("carried over (plain values of the state that training changed, which setup() made again as they "
               f"began): state['trainer'].iter_num = {paused.step}, state['trainer'].best = ")
    assert rebuilt.ok and any(note.startswith(carried) for note in rebuilt.notes), rebuilt
    live.send(StepOnce())
    after = live.wait_for(is_event("step", step=paused.step + 1), timeout=30)
    assert after.scalars["count"] == paused.step + 1
