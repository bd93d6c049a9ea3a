"""A rebuild shuts the old state's DataLoader workers down itself, and a worker torch's shutdown leaves is killed.

Found porting pytorch/examples' imagenet trainer (`-j 1`): every rebuild took 10.2 s (0.16 s with no workers), and
left one more worker process behind. The old state is a reference cycle (`state["batches"] = epochs(state)`), and
a DataLoader iterator freed by the garbage collector with its queues waits 5 s for workers that never get their
final message, then sends a SIGTERM they ignore while vram-bench lives.
"""

from __future__ import annotations

import gc
import multiprocessing
import os

import torch

from conftest import is_event
from workbench.engine.forked_children import keep_data_loader_workers
from workbench.engine.released_iterators import release_iterators
from workbench.protocol.events import Rebuild, StepOnce


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index))


def _loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=1)


def _workers() -> set[int]:
    return {child.pid for child in multiprocessing.active_children()}


def test_closing_the_old_generator_ends_its_loaders_workers_cleanly_before_any_collection() -> None:
    loader = _loader()

    def epochs(state):  # type: ignore[no-untyped-def]
        while True:
            yield from loader

    before = _workers()
    state: dict = {}
    state["batches"] = epochs(state)  # a cycle: only the garbage collector would free it
    next(state["batches"])
    started = _workers() - before
    assert started, "the loader's worker runs"
    assert release_iterators(state, {"batches": epochs({})}) == []
    assert not started & _workers(), "its worker has exited already: shut down in order, not by the collector"


def test_a_loader_iterator_in_the_state_is_shut_down_and_its_worker_exits_on_its_final_message() -> None:
    state: dict = {"it": iter(_loader())}
    state["self"] = state
    next(state["it"])
    processes = list(state["it"]._workers)
    release_iterators(state, {})
    assert [p.exitcode for p in processes] == [0], "a clean exit, not torch's terminate() after 5 s"


def test_an_iterator_the_new_state_keeps_is_left_running() -> None:
    it = iter(_loader())
    next(it)
    release_iterators({"it": it}, {"it": it})
    assert next(it).shape == (4, 2)
    del it


def test_a_worker_that_ignores_torchs_terminate_is_killed_not_left_behind() -> None:
    put_back = keep_data_loader_workers(os.getpid())  # workers ignore SIGTERM while their owner lives
    try:
        state: dict = {"it": iter(_loader())}
        state["self"] = state
        next(state["it"])
        processes = list(state["it"]._workers)
        del state
        gc.collect()  # the cycle's queues are finalized first: the worker never hears the final message
        assert [p.is_alive() for p in processes] == [False], "killed after torch's terminate() was ignored"
    finally:
        put_back()


PROJECT = """\
import torch


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.full((2,), float(index))


loader = torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=1)


def epochs(state):
    for epoch in range(100):
        for batch in loader:
            yield batch


def setup(bench):
    model = torch.nn.Linear(2, 1)
    state = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}
    state["batches"] = epochs(state)
    return state


def step(state, bench):
    loss = state["model"](next(state["batches"])).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""


def test_a_rebuild_ends_the_old_loaders_worker_at_once(start_session) -> None:
    live = start_session({"train.py": PROJECT}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    before = _workers()
    for step in (1, 2):
        live.send(StepOnce())
        live.wait_for(is_event("step", step=step))
    old = _workers() - before
    assert old, "the loader's worker runs"
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok, rebuilt
    assert not old & _workers(), "the old state's worker has exited by the time the rebuild is done"
    assert rebuilt.seconds < 4.0, f"no wait for a worker that never hears its final message ({rebuilt.seconds:.1f} s)"
    live.send(StepOnce())
    live.wait_for(is_event("step", step=3))
