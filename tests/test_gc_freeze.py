"""Freezing what setup() left alive: full collections get short, and nothing that must be freed or seen is lost."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

from tests.conftest import is_event
from workbench.protocol.events import RunCleanup
from workbench.engine.memory.gc_freeze import collect_all, freeze_survivors, is_frozen, release, thawed
from workbench.engine.memory.leaks import find_leaks


class Node:
    """A gc-tracked object that can be put in a reference cycle."""

    def __init__(self) -> None:
        self.me = self
        self.payload = torch.zeros(4)


@pytest.fixture
def frozen_after() -> Iterator[None]:
    """Whatever a test freezes is released again, so later tests collect normally."""
    yield
    release()


def ids_of_tracked() -> set[int]:
    return {id(o) for o in gc.get_objects()}


def test_freeze_moves_survivors_out_of_collections_but_never_garbage(frozen_after) -> None:
    alive = Node()
    garbage = Node()
    garbage_ref = weakref.ref(garbage)
    del garbage

    frozen = freeze_survivors()

    assert garbage_ref() is None, "the collection before the freeze must free existing cyclic garbage"
    assert is_frozen() and frozen.objects == gc.get_freeze_count() > 0
    assert id(alive) not in ids_of_tracked(), "a frozen object is skipped by collections"
    young = Node()
    assert id(young) in ids_of_tracked(), "objects made after the freeze are collected as usual"


def test_collect_all_frees_frozen_objects_that_became_cyclic_garbage(frozen_after) -> None:
    node = Node()
    ref = weakref.ref(node)
    freeze_survivors()
    del node

    gc.collect()
    assert ref() is not None, "an ordinary collection skips frozen cycles (why collect_all exists)"
    freed = collect_all()
    assert ref() is None and freed > 0
    assert is_frozen(), "the survivors are frozen again"


def test_thawed_shows_every_object_inside_and_freezes_again_after(frozen_after) -> None:
    node = Node()
    freeze_survivors()
    assert id(node) not in ids_of_tracked()
    with thawed():
        assert id(node) in ids_of_tracked()
        assert any(r is not node for r in gc.get_referrers(node))
    assert is_frozen() and id(node) not in ids_of_tracked()


def test_release_returns_everything_to_ordinary_collection() -> None:
    node = Node()
    freeze_survivors()
    release()
    assert not is_frozen() and id(node) in ids_of_tracked()


def test_the_leak_finder_sees_frozen_holders(frozen_after) -> None:
    """A module-level list made before the freeze keeps graphs alive: still found, with its name."""
    model = torch.nn.Linear(8, 8)
    kept: list[torch.Tensor] = []
    holder = {"KEPT": kept}  # a frozen dict, like a module's globals
    for _ in range(5):
        kept.append(model(torch.randn(2, 8)).sum())
    freeze_survivors()

    report = find_leaks({"model": model})

    top = report.suspects[0]
    assert top.count == 5 and "grad_fn" in top.description
    assert top.referrers[0] == "list (5 items)"
    assert is_frozen(), "the scan freezes again when it is done"
    del holder


# --------------------------------------------------------------------------- in a session

SETUP_MAKES_A_CYCLE = """\
import torch

HELD = []  # a weak reference to the cyclic junk setup() makes, for the test to watch


class Junk:
    def __init__(self):
        self.me = self
        self.tensor = torch.zeros(1024)


def setup(bench):
    junk = Junk()
    HELD.append(__import__("weakref").ref(junk))
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "junk": junk}


def step(state, bench):
    state.pop("junk", None)  # dropped after the freeze: cyclic garbage that only collect_all frees
    x = torch.randn(8, 4)
    loss = state["model"](x).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss}
"""


def test_a_session_freezes_after_setup_cleanup_frees_frozen_garbage_and_close_releases(start_session) -> None:
    live = start_session({"train.py": SETUP_MAKES_A_CYCLE})
    live.wait_running(steps=3)
    worker = live.session.worker
    assert worker.frozen is not None and worker.frozen.objects > 0 and is_frozen()
    junk_ref = live.session.project.module.HELD[0]
    gc.collect()
    assert junk_ref() is not None, "frozen after setup: ordinary collections leave it"

    live.send(RunCleanup())
    live.wait_for(is_event("cleanup"), timeout=20)
    assert junk_ref() is None, "cleanup collects frozen objects too"
    assert is_frozen()

    live.session.close()
    assert not is_frozen(), "a closed session gives the freeze back"


def test_no_gc_freeze_leaves_collection_alone(start_session) -> None:
    live = start_session({"train.py": SETUP_MAKES_A_CYCLE}, freeze_gc=False)
    live.wait_running(steps=3)
    assert live.session.worker.frozen is None and not is_frozen()
    gc.collect()
    assert live.session.project.module.HELD[0]() is None
