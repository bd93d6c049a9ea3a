"""The walks over the state (models and optimizers, instances of a class, LR schedulers) go into the same places:
`state_walk.children`, so a model, an optimizer or a scheduler kept in a dataclass, a list or an object's attribute
is found by every one of them, and none goes into a class, a module or a callable."""

from __future__ import annotations

import dataclasses
import math

import torch

from workbench.engine.actions.schedulers import find_schedulers
from workbench.engine.state_walk import children, find_instances, find_modules_and_optimizers


@dataclasses.dataclass
class Holder:
    nets: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    _private: object = None


def test_every_walk_finds_what_a_dataclass_a_list_and_a_dict_hold() -> None:
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    state = {"run": Holder([net], opt, sched), "math": math, "fn": len}
    modules, optimizers = find_modules_and_optimizers(state)
    assert modules == {"run.nets[0]": net} and optimizers == {"run.opt": opt}
    assert find_instances(state, torch.nn.Linear) == ["run.nets[0]"]
    assert find_schedulers(state) == {"run.sched": sched}


def test_children_are_items_and_public_attributes_not_a_modules_or_a_callables() -> None:
    holder = Holder([1, 2], None, None, _private="hidden")  # type: ignore[arg-type]
    assert [p for p, _ in children(holder, "h")] == ["h.nets", "h.opt", "h.sched"]
    assert [p for p, _ in children({"a": 1}, "")] == ["a"] and [p for p, _ in children((5,), "t")] == ["t[0]"]
    assert list(children(math, "m")) == [] and list(children(len, "f")) == [] and list(children(Holder, "c")) == []
    assert len(list(children(list(range(1000)), "big"))) == 256, "a long list is data: its first items only"
