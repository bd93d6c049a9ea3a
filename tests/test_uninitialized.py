"""Parameters setup() leaves holding garbage (workbench/engine/uninitialized.py): named before the first step,
and never carried over by the rebuild that follows the fix.

Found porting pytorch/examples' FSDP2 trainer: its model is built on the meta device, `to_empty()`, then
`reset_parameters()`, which does not reach the transformer blocks; on a CPU their memory held NaN and 1e30s, the
first step's loss was NaN, and the message blamed that step."""

from __future__ import annotations

import torch

from tests.conftest import is_event, save
from tests.test_rebuild import MODEL_PY  # Net: body (4 -> 8), head (8 -> 1)
from workbench.engine.rebuild import carry_over
from workbench.engine.uninitialized import holds_garbage, suspect_parameters
from workbench.protocol.events import Rebuild

TRAIN_PY = """\
import torch
from model import Net

INITIALIZED = ("head",)


def setup(bench):
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Net()
    model.to_empty(device=bench.device)
    with torch.no_grad():  # what to_empty() left: this test's garbage is deterministic
        for p in model.parameters():
            p.fill_(float("nan"))
    for name in INITIALIZED:
        getattr(model, name).reset_parameters()
    return {"model": model, "opt": torch.optim.Adam(model.parameters(), lr=0.01)}


def step(state, bench):
    x = torch.randn(16, 4)
    loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss
"""


def test_garbage_is_non_finite_or_absurdly_large_and_honest_values_are_not():
    honest = torch.nn.Linear(64, 64)
    assert not holds_garbage(honest.weight)
    assert not holds_garbage(torch.nn.Parameter(torch.full((1000,), 300.0)))  # large, not absurd
    assert holds_garbage(torch.nn.Parameter(torch.tensor([1.0, float("inf")])))
    assert holds_garbage(torch.nn.Parameter(torch.full((100,), 1e30)))  # finite garbage: a NaN a step later
    assert holds_garbage(torch.nn.Parameter(torch.tensor([1.0, float("nan")], dtype=torch.float16)))
    assert not holds_garbage(torch.nn.Parameter(torch.full((4096, 64), 60000.0, dtype=torch.float16)))  # norm > fp16 max
    assert holds_garbage(torch.nn.Parameter(torch.full((10,), 1e30, dtype=torch.bfloat16)))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        model[0].bias[2] = float("nan")
    model[1].running_var.fill_(float("nan"))  # a buffer: not a parameter, not judged here
    assert suspect_parameters({"net": model}) == ["net.0.bias"]


def test_a_rebuild_does_not_carry_a_parameter_holding_garbage_nor_its_optimizer_state():
    old = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    old_opt = torch.optim.Adam(old.parameters())
    old(torch.randn(2, 4)).sum().backward()
    old_opt.step()
    with torch.no_grad():
        old[0].weight.fill_(float("nan"))
    new = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    fresh = new[0].weight.detach().clone()
    new_opt = torch.optim.Adam(new.parameters())
    report = carry_over({"model": old, "opt": old_opt}, {"model": new, "opt": new_opt})
    assert report.garbage == ["model.0.weight"]
    assert torch.equal(new[0].weight, fresh)  # the new setup()'s value stays
    assert torch.equal(new[1].weight, old[1].weight) and report.tensors == 3
    assert new[0].weight not in new_opt.state and new[1].weight in new_opt.state
    assert report.optimizer_states == 3


def test_garbage_setup_leaves_is_named_before_the_first_step_and_the_fixed_setup_rebuilt_trains(start_session):
    live = start_session({"train.py": TRAIN_PY, "model.py": MODEL_PY})
    warning = live.wait_for(is_event("error", where="parameters"), timeout=30)
    assert "in 2 parameters: model.body.weight, model.body.bias" in warning.message, warning.message
    assert warning.is_warning and "uninitialized memory" in warning.message and "rebuild" in warning.message
    nan = live.wait_for(is_event("error", where="step"), timeout=30)
    assert "loss is nan at step 1" in nan.message and "setup() had left garbage in 2 of them" in nan.message, nan.message
    live.wait_for(is_event("paused", reason="non-finite loss"), timeout=10)
    # The fix: every submodule initialized. setup() changed: held for a rebuild, which must not carry the NaNs over
    # (the failed step has spread them to every parameter and to Adam's moments).
    save(live.entry, TRAIN_PY.replace('INITIALIZED = ("head",)', 'INITIALIZED = ("body", "head")'))
    live.wait_for(is_event("reload", file="train.py"), timeout=30)
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"), timeout=30)
    assert rebuilt.ok and rebuilt.tensors_carried == 0, rebuilt
    assert any(n.startswith("not carried over: model.body.weight, model.body.bias, model.head.weight") for n in rebuilt.notes)
    live.wait_for(is_event("resumed", reason="rebuild"), timeout=10)
    after = live.events.steps(5)
    assert all(torch.isfinite(torch.tensor(float(e.loss))) for e in after), [e.loss for e in after]
    assert not [e for e in live.events.after(rebuilt) if e.name == "error" and e.where == "parameters"]
