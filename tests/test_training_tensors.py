"""Tensors training keeps beside the model (an LSTM's hidden state carried across batches, as pytorch/examples'
word_language_model does) are kept in snapshots, put back at resume and carried by a rebuild (training_tensors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import is_event, make_project, open_session, snapshot_after
from workbench.engine import training_tensors
from workbench.engine.training_globals import STATE, state_namespace
from workbench.engine.training_tensors import TrainingTensors, put_back

# word_language_model's loop, ported: the hidden state goes from one batch to the next through setup()'s state.
CARRIED_HIDDEN = """\
import torch

torch.manual_seed(0)
tokens = torch.randint(0, 50, (2000,))


def setup(bench):
    torch.manual_seed(1)
    model = torch.nn.LSTM(8, 16, num_layers=2)
    embed = torch.nn.Embedding(50, 8)
    head = torch.nn.Linear(16, 50)
    params = [*model.parameters(), *embed.parameters(), *head.parameters()]
    return {"model": model, "embed": embed, "head": head, "opt": torch.optim.SGD(params, lr=0.5),
            "hidden": (torch.zeros(2, 4, 16), torch.zeros(2, 4, 16)), "i": 0}


def step(state, bench):
    i = state["i"] % 1900
    x = tokens[i:i + 40].view(10, 4)
    y = tokens[i + 1:i + 41].view(10, 4)
    hidden = tuple(h.detach() for h in state["hidden"])
    out, hidden = state["model"](state["embed"](x), hidden)
    state["hidden"] = hidden
    loss = torch.nn.functional.cross_entropy(state["head"](out).view(-1, 50), y.reshape(-1))
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    state["i"] += 40
    return loss
"""


def losses_of(live) -> dict[int, float]:
    return {e.step: e.loss for e in live.events.of("step")}


def straight(tmp_path: Path, steps: int) -> dict[int, float]:
    root = make_project(tmp_path, {"train.py": CARRIED_HIDDEN}, folder="straight")
    with open_session(root / "train.py", max_steps=steps, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        return losses_of(live)


def test_a_hidden_state_carried_across_batches_is_kept_and_the_resumed_run_computes_the_same_losses(tmp_path: Path) -> None:
    """It was not kept: the resume began it at setup()'s zeros, said nothing, and every loss after it differed."""
    expected = straight(tmp_path, 12)
    snapshot = snapshot_after(tmp_path, CARRIED_HIDDEN, 6)
    saved = torch.load(snapshot, weights_only=True)["loader_places"]["ranks"][0]["tensors"]
    assert list(saved) == [f"{STATE}.hidden"] and saved[f"{STATE}.hidden"][0].shape == (2, 4, 16), saved
    root = make_project(tmp_path, {"train.py": CARRIED_HIDDEN}, folder="second")
    with open_session(root / "train.py", resume=snapshot, max_steps=12, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        after = losses_of(live)
    assert "put back from the snapshot (tensors training changed): state['hidden']" in resumed.notes, resumed.notes
    assert after == {k: expected[k] for k in range(7, 13)}, (after, expected)


def test_a_rebuild_gives_the_new_state_the_hidden_state_training_reached(tmp_path: Path) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    expected = straight(tmp_path, 10)
    root = make_project(tmp_path, {"train.py": CARRIED_HIDDEN}, folder="rebuilt")
    with open_session(root / "train.py", max_steps=5, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        live.send(Rebuild())
        rebuilt = live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and "carried over (tensors of the state that training changed): state['hidden']" in rebuilt.notes
        for k in range(6, 11):
            live.send(StepOnce())
            live.wait_for(is_event("step", step=k), timeout=30)
        assert losses_of(live) == expected
        live.send(StepOnce())  # a snapshot right after the rebuild keeps the carried state too (the baseline is setup()'s)
        live.wait_for(is_event("step", step=11), timeout=30)
        kept, _ = live.session.worker.training_tensors.changed(state_namespace(live.session.worker.user_state), [])
        assert list(kept) == [f"{STATE}.hidden"], kept


def test_what_counts_as_training_state_and_what_does_not() -> None:
    model = torch.nn.BatchNorm1d(3)
    state = {"hidden": torch.zeros(2), "data": torch.arange(5.0), "stats": torch.zeros(3), "buffer": model.running_mean,
             "pair": (torch.zeros(1), None), "mixed": (torch.zeros(1), "text"), "weight": torch.nn.Parameter(torch.ones(1))}
    marks = TrainingTensors()
    marks.mark(state_namespace(state))
    state["hidden"] = torch.ones(2)  # bound to another tensor
    state["stats"].add_(1)  # changed in place: its version counter moved
    model.running_mean.add_(1)  # the model's own buffer: the model carries it
    state["pair"] = (torch.ones(1), None)
    state["mixed"] = (torch.ones(1), "other")  # not made of tensors only
    kept, refused = marks.changed(state_namespace(state), [model])
    assert sorted(kept) == [f"{STATE}.hidden", f"{STATE}.pair", f"{STATE}.stats"] and not refused, kept
    assert not kept[f"{STATE}.hidden"].requires_grad


def test_more_than_a_snapshot_keeps_is_named_and_a_value_setup_now_lays_out_otherwise_is_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_tensors, "MAX_KEPT_BYTES", 1024)
    state = {"small": torch.zeros(4), "big": torch.zeros(1000)}
    marks = TrainingTensors()
    marks.mark(state_namespace(state))
    state["small"], state["big"] = torch.ones(4), torch.ones(1000)
    kept, refused = marks.changed(state_namespace(state), [])
    assert list(kept) == [f"{STATE}.small"], kept
    assert refused == {"state['big']": "0.0 MiB of tensors training changed, more than the 0 MiB a snapshot keeps of "
                                       "them per rank"}, refused

    fresh = {"small": torch.zeros(5)}
    done, left = put_back(kept, state_namespace(fresh))
    assert done == [] and left == ["state['small'] (setup() makes it otherwise now: it is (4,) torch.float32 then (5,) "
                                   "torch.float32)"], left
    assert torch.equal(fresh["small"], torch.zeros(5))


PER_RANK_HIDDEN = """\
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(bench):
    torch.manual_seed(100 + bench.rank)
    model = DDP(torch.nn.Linear(1, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "hidden": torch.zeros(3)}


def step(state, bench):
    time.sleep(0.05)  # the test's pause lands a few steps in
    ix = torch.randint(0, 24, (2,))
    state["hidden"] = state["hidden"] * 0.5 + ix.float().mean()  # each rank's own, from its own batches
    loss = state["model"](ix.float()[:, None] / 24).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    bench.log(a=float(ix[0]), b=float(state["hidden"].sum()))
    return loss
"""


def test_under_torchrun_each_rank_resumes_its_own_hidden_state(tmp_path: Path) -> None:
    from tests.test_loader_places import snapshot_a_few_steps_in, two_rank_batches

    before, _ = two_rank_batches(tmp_path, PER_RANK_HIDDEN, "--max-steps", "30", folder="straight")
    assert before[0][5] != before[1][5], "each rank's own"
    taken = snapshot_a_few_steps_in(tmp_path, PER_RANK_HIDDEN)
    at = taken["step"]
    after, again = two_rank_batches(tmp_path, PER_RANK_HIDDEN, "--resume", taken["path"], "--max-steps", "30",
                                    folder="first")
    resumed = next(e for e in again.events if e["event"] == "resume")
    assert "put back from the snapshot (tensors training changed): state['hidden']" in resumed["notes"], resumed
    for rank in (0, 1):
        assert after[rank] == {k: before[rank][k] for k in range(at + 1, 31)}, (rank, after[rank], before[rank])


def test_a_new_tensor_at_the_freed_address_of_setups_is_still_a_change() -> None:
    """Changes were told by ids: a hidden state rebound to a new tensor that CPython gave the freed address of
    setup()'s (version 0, as every fresh result) looked unchanged and was left out of the snapshot."""
    state = {"hidden": torch.zeros(2)}
    marks = TrainingTensors()
    marks.mark(state_namespace(state))
    old = id(state["hidden"])
    state["hidden"] = None
    for _ in range(10_000):
        fresh = torch.ones(2)
        if id(fresh) == old:
            break
        del fresh
    else:
        pytest.skip("CPython gave no new tensor the freed address this time")
    state["hidden"] = fresh
    assert list(marks.changed(state_namespace(state), [])[0]) == [f"{STATE}.hidden"]


def test_a_view_of_a_parameter_is_the_models_and_a_value_made_under_inference_mode_is_no_candidate() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.inference_mode():
        table = torch.arange(4.0)
    state = {"weight": model.weight.detach(), "table": table, "layers": {0: torch.zeros(1), 1: torch.zeros(1)}}
    marks = TrainingTensors()
    marks.mark(state_namespace(state))  # an inference tensor has no version counter: this raised, failing setup()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # the view's version moves with the weight's
    state["layers"] = {0: torch.ones(1), 1: torch.ones(1)}  # per-layer states by int keys
    kept, _ = marks.changed(state_namespace(state), [model])
    assert list(kept) == [f"{STATE}.layers"], kept


def test_a_setup_that_keeps_a_tensor_made_under_inference_mode_runs(start_session) -> None:
    live = start_session({"train.py": """\
import torch


def setup(bench):
    with torch.inference_mode():
        table = torch.arange(4.0)
    return {"table": table}


def step(state, bench):
    return state["table"].sum() * 0
"""})
    steps = live.wait_running(2)
    assert len(steps) == 2
