"""Fixture for bench/edit_kinds.py: the entry file of a tiny vram-bench project.

setup() builds live objects of every kind a hot reload has to deal with (a
module, an optimizer with momentum, a suspended generator, closures and a
lambda kept in the state, a forward hook); step() is a plain training step.
"""

import functools
import os
import time

import torch

from model import Config, Net, forward_hook

LR = 0.1
N = int(os.environ.get("EDIT_KINDS_N", "3"))
ACT = lambda t: t + 1  # noqa: E731


def helper(x):
    return x * 2


def scaled(x, factor=2):
    return x * factor


def kw_only(x, *, k=2):
    return x * k


def shared():
    return "old"


def boom():
    raise ValueError("boom")


@torch.no_grad()
def no_grad_fn():
    return ("old", torch.is_grad_enabled())


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


def shout(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs).upper()

    return wrapper


@logged
def wrapped_fn():
    return "old"


@logged
def greet():
    return "hi"


def outer(x):
    def inner(y):
        return y + 1

    return inner(x)


def make_schedule(base):
    def schedule(step):
        return base

    return schedule


def make_scaler(k):
    def scale(x):
        return x * k

    return scale


def batches(d=4):
    while True:
        x = torch.randn(8, d)
        yield x, x.sum(dim=1, keepdim=True), "old"


def setup(bench):
    import other

    torch.manual_seed(0)
    model = Net()
    model.register_forward_hook(forward_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return {
        "model": model,
        "opt": opt,
        "data": batches(),
        "cfg": Config(),
        "schedule": make_schedule(0.5),
        "scaler": make_scaler(2),
        "act": ACT,
        "use_shared": other.use_shared,
        "setup_tag": "old",
        "steps": 0,
    }


def step(state, bench):
    time.sleep(0.003)
    x, y, tag = next(state["data"])
    state["data_tag"] = tag
    for group in state["opt"].param_groups:
        group["lr"] = LR
    state["lr_seen"] = LR
    loss = ((state["model"](x) - y) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    state["steps"] += 1
    return loss
