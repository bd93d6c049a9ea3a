"""Planning ahead on ranks > 0 (workbench/engine/prepare_ahead.py), over a real c10d TCPStore: three ranks in one
process, each with its own client, as torchrun's ranks have."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch.distributed as dist

from workbench.engine.prepare_ahead import PrepareAhead

WORLD = 3


@pytest.fixture
def store() -> Iterator[dist.Store]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.PrefixStore("vram-bench/ahead-0", master)


def ranks(store: dist.Store, prepare: Callable[[int], Callable[[str, str], object]]) -> list[PrepareAhead]:
    return [PrepareAhead(store, rank, WORLD, prepare(rank)) for rank in range(WORLD)]


def planned_by(rank: int) -> Callable[[str, str], object]:
    return lambda path, source: (rank, path, source)


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_every_other_rank_plans_the_announced_source_and_the_store_forgets_it_once_all_read(store: dist.Store) -> None:
    made: list[tuple[int, str, str]] = []

    def prepare(rank: int) -> Callable[[str, str], object]:
        def plan(path: str, source: str) -> object:
            made.append((rank, path, source))
            return (rank, path, source)
        return plan

    zero, one, two = ranks(store, prepare)
    try:
        source = "LR = 0.02\nprint('é')\n"  # not ASCII: the bytes cross as UTF-8
        zero.announce("sub/train.py", source)
        wait_until(lambda: len(made) == 2)
        assert sorted(made) == [(1, "sub/train.py", source), (2, "sub/train.py", source)]
        assert one.take("sub/train.py", source) == (1, "sub/train.py", source)
        assert two.take("sub/train.py", source) == (2, "sub/train.py", source)
        assert one.take("sub/train.py", source) is None  # taken once
        wait_until(lambda: not store.check(["source/1"]) and not store.check(["read/1"]))
    finally:
        for rank in (zero, one, two):
            rank.close()


def test_a_plan_is_used_only_for_the_very_same_bytes(store: dist.Store) -> None:
    zero, one, two = ranks(store, planned_by)
    try:
        zero.announce("train.py", "LR = 0.02\n")
        zero.announce("train.py", "LR = 0.03\n")  # two saves of one file: each keeps its own plan
        wait_until(lambda: one.take("train.py", "LR = 0.03\n") is not None)
        assert one.take("train.py", "LR = 0.04\n") is None  # the exchange carried other bytes: plan at the boundary
        assert one.take("model.py", "LR = 0.02\n") is None
        assert one.take("train.py", "LR = 0.02\n") == (1, "train.py", "LR = 0.02\n")
        assert zero.take("train.py", "LR = 0.02\n") is None  # rank 0 keeps its own plans, not these
    finally:
        for rank in (zero, one, two):
            rank.close()


def test_the_boundary_waits_for_a_plan_still_being_made_and_a_failed_one_leaves_it_to_plan_itself(
        store: dist.Store) -> None:
    release = threading.Event()

    def prepare(rank: int) -> Callable[[str, str], object]:
        def plan(path: str, source: str) -> object:
            if "raise" in source:
                raise SyntaxError("invalid syntax")
            release.wait(10)
            return (rank, source)
        return plan

    zero, one, two = ranks(store, prepare)
    try:
        zero.announce("train.py", "slow\n")
        wait_until(lambda: ("train.py", "slow\n") in one._plans)
        taken: list[object] = []
        taker = threading.Thread(target=lambda: taken.append(one.take("train.py", "slow\n")))
        taker.start()
        taker.join(0.3)
        assert taker.is_alive() and not taken  # still planning: the boundary waits rather than plans twice
        release.set()
        taker.join(10)
        assert taken == [(1, "slow\n")]
        zero.announce("train.py", "raise\n")
        wait_until(lambda: ("train.py", "raise\n") in two._plans and two._plans[("train.py", "raise\n")].done())
        assert two.take("train.py", "raise\n") is None
    finally:
        release.set()
        for rank in (zero, one, two):
            rank.close()


def test_closing_ends_the_listeners_at_once_and_rank_0_announces_nothing_after(store: dist.Store) -> None:
    zero, one, two = ranks(store, planned_by)
    started = time.monotonic()
    for rank in (one, two, zero):
        rank.close()
    assert time.monotonic() - started < 2.0
    assert one._listener is not None and not one._listener.is_alive()
    assert two._listener is not None and not two._listener.is_alive()
    zero.announce("train.py", "LR = 0.02\n")
    assert not store.check(["source/1"]) or bytes(store.get("source/1")) == b"closed"


def test_a_single_rank_job_posts_nothing(store: dist.Store) -> None:
    alone = PrepareAhead(store, 0, 1, planned_by(0))
    alone.announce("train.py", "LR = 0.02\n")
    assert not store.check(["source/1"])
    assert alone._listener is None
    alone.close()
