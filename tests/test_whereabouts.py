"""The pieces of workbench/engine/whereabouts.py: a rank's place read off its real thread, written to and read from
a real c10d TCPStore, and put in words. The whole path (real torchrun, a rank stuck or failed, rank 0's report and
`interrupt`) is in tests/test_distributed.py."""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from workbench.engine.whereabouts import (
    Board,
    Place,
    ThreadCpu,
    evaluate_advice,
    describe,
    describe_all,
    frames_of,
    takes_interrupt,
    waited_for,
)

WAITER = '''
import threading


def wait_here(event):
    event.wait()  # line 6


def spin_here(stop):
    while not stop.is_set():  # line 10
        pass
'''


@pytest.fixture
def project_module(tmp_path: Path):
    (tmp_path / "waiter.py").write_text(WAITER)
    sys.path.insert(0, str(tmp_path))
    try:
        import waiter

        yield tmp_path, waiter
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("waiter", None)


def frames_in(root: Path, thread: threading.Thread, **kwargs):
    """frames_of for a project in `root` (files named relative to it)."""
    return frames_of(thread.ident, lambda f: f.startswith(str(root)), lambda f: str(Path(f).relative_to(root)), **kwargs)


def test_a_thread_waiting_in_a_library_is_placed_at_its_project_line_and_inside_the_library(project_module):
    root, waiter = project_module
    event = threading.Event()
    thread = threading.Thread(target=waiter.wait_here, args=(event,))
    thread.start()
    try:
        time.sleep(0.2)
        frame, code, inside, in_exchange = frames_in(root, thread)
    finally:
        event.set()
        thread.join()
    assert frame == "waiter.py:6 in wait_here"
    assert code == "event.wait()  # line 6"
    assert inside is not None and "threading.py" in inside and "in wait" in inside, inside
    assert not in_exchange


def test_the_line_shown_is_the_running_codes_not_a_later_save(project_module):
    root, waiter = project_module
    stop = threading.Event()
    thread = threading.Thread(target=waiter.spin_here, args=(stop,))
    thread.start()
    try:
        time.sleep(0.1)
        (root / "waiter.py").write_text("# saved since, not applied\n" * 20)
        frame, code, _, _ = frames_in(root, thread, source=lambda f: WAITER)
    finally:
        stop.set()
        thread.join()
    assert frame is not None and frame.startswith("waiter.py:1")
    assert code is not None and ("while not stop.is_set()" in code or code == "pass"), code


def test_a_busy_thread_uses_a_core_and_a_waiting_one_none(project_module):
    _, waiter = project_module
    stop, event = threading.Event(), threading.Event()
    busy = threading.Thread(target=waiter.spin_here, args=(stop,))
    idle = threading.Thread(target=waiter.wait_here, args=(event,))
    busy.start()
    idle.start()
    try:
        clocks = ThreadCpu(busy.ident), ThreadCpu(idle.ident)
        assert [c.share() for c in clocks] == [None, None]  # the first look has nothing to compare with
        time.sleep(0.5)
        busy_share, idle_share = (c.share() for c in clocks)
    finally:
        stop.set()
        event.set()
        busy.join()
        idle.join()
    assert busy_share is not None and busy_share > 0.2, busy_share  # shares the GIL with this thread's sleep only
    assert idle_share is not None and idle_share < 0.05, idle_share


def test_ranks_tell_their_places_rank_0_reads_them_and_an_interrupt_is_counted():
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    store = dist.PrefixStore("vram-bench/where-0", server)
    rank0, rank1 = Board(store, 0, 2), Board(store, 1, 2)
    assert rank0.places() == {}
    told = Place(1, "step", 41, 12.5, "train.py:30 in step", "while True: pass", None, 0.97, None, time.time())
    rank1.tell(told)
    assert rank0.places() == {1: told}
    rank1.forget()
    assert rank0.places() == {}
    rank1.forget()  # nothing told: nothing to remove, no error
    assert rank1.interrupts() == 0
    assert rank0.interrupt() == 1
    assert rank1.interrupts() == 1


def test_a_place_in_words():
    now = time.time()
    stuck = Place(1, "step", 41, 12.4, "train.py:30 in step", "while True: pass", None, 0.97, None, now)
    assert describe(stuck, now) == "rank 1: in step 42 for 12 s, at train.py:30 in step (`while True: pass`), busy (97% of a core)"
    waiting = Place(0, "step", 41, 12.0, "train.py:36 in step", "loss.backward()", "torch/autograd/graph.py:979 in x", 0.0,
                    None, now)
    assert "inside torch/autograd/graph.py:979 in x, idle (0% of a core)" in describe(waiting, now)
    failed = Place(1, "paused", 41, 3.0, "train.py:22", None, None, 0.0, "step() raised ValueError: only on rank 1", now)
    assert describe(failed, now) == "rank 1: paused after step 41: step() raised ValueError: only on rank 1 (train.py:22)"
    old = Place(2, "exchange", 41, 5.0, None, None, None, 0.0, None, now - 30)
    said = describe(old, now)
    assert said.startswith("rank 2: waiting for the other ranks between steps 41 and 42 for 35 s")
    assert "it has said nothing since" in said


def test_only_a_rank_that_is_not_waiting_inside_a_library_takes_an_interrupt():
    busy_in_torch = Place(0, "step", 1, 9.0, "train.py:5 in step", None, "torch/nn/functional.py:1 in f", 0.99)
    waiting_in_torch = Place(0, "step", 1, 9.0, "train.py:5 in step", None, "torch/autograd/graph.py:1 in r", 0.0)
    own_loop = Place(1, "step", 1, 9.0, "train.py:9 in step", "while True: pass", None, 0.0)
    assert takes_interrupt(busy_in_torch) and takes_interrupt(own_loop)
    assert not takes_interrupt(waiting_in_torch)
    assert not takes_interrupt(Place(1, "paused", 1, 9.0))


def test_ranks_at_the_same_place_are_said_once_and_silent_ranks_in_ranges():
    now = time.time()
    own = Place(0, "step", 57, 30.0, "train.py:36 in step", "loss.backward()", "torch/autograd/graph.py:979 in r", 0.0,
                None, now)
    waiting = {r: Place(r, "step", 57, 29.0 + r / 100, "train.py:36 in step", "loss.backward()",
                        "torch/autograd/graph.py:979 in r", 0.01 * r, None, now) for r in (1, 2, 3, 5, 6)}
    stuck = Place(4, "step", 57, 31.0, "data.py:12 in next_batch", "while not ready():", None, 0.99, None, now)
    lines = describe_all({0: own, **waiting, 4: stuck}, 10, now)
    assert len(lines) == 4, lines
    assert lines[0].startswith("rank 0: in step 58 for 30 s")
    assert lines[1].startswith("ranks 1-3, 5-6: in step 58 for 29 s, at train.py:36 in step (`loss.backward()`)"), lines[1]
    assert lines[1].endswith(", idle"), lines[1]  # one share of a core would be wrong for the others
    assert lines[2] == "rank 4: in step 58 for 31 s, at data.py:12 in next_batch (`while not ready():`), busy (99% of a core)"
    assert lines[3] == "ranks 7-9: not held up (training, or between steps)"
    assert describe_all({0: own}, 2, now)[1] == "rank 1: not held up (training, or between steps)"


def test_ranks_in_an_agreed_evaluate_are_placed_in_it_or_done_with_it_and_only_those_in_it_take_an_interrupt():
    now = time.time()
    inside = Place(0, "evaluate", 40, 6.0, "train.py:70 in evaluate", "dist.all_reduce(total)",
                   "torch/distributed/c10d_logger.py:81 in wrapper", 0.0, None, now)
    done = Place(1, "evaluated", 40, 6.0, None, None, None, 0.0, None, now)
    spinning = Place(1, "evaluate", 40, 6.0, "train.py:72 in evaluate", "while True: pass", None, 0.99, None, now)
    assert describe(inside, now) == ("rank 0: in evaluate() for 6 s, at train.py:70 in evaluate (`dist.all_reduce(total)`), "
                                     "inside torch/distributed/c10d_logger.py:81 in wrapper, idle (0% of a core)")
    assert describe(done, now) == "rank 1: done with evaluate(), waiting 6 s for the other ranks to finish theirs"
    assert takes_interrupt(spinning) and not takes_interrupt(inside) and not takes_interrupt(done)
    advice = evaluate_advice({0: inside, 1: done}, "a training collective gives up after 5 min")
    assert advice.startswith("rank 0 waits inside torch/distributed/c10d_logger.py:81 in wrapper for rank 1, which "
                             "finished evaluate() without that collective"), advice
    assert advice.endswith("A training collective gives up after 5 min."), advice
    assert "press i" in evaluate_advice({0: inside, 1: spinning}, "")  # a rank busy in it: stuck, not unmatched


def test_the_status_bar_says_a_rank_whose_data_ran_out_apart_from_one_whose_step_failed():
    own = Place(0, "step", 9, 6.0, cpu=0.0)
    failed = Place(1, "paused", 8, 6.0, failure="step() raised ValueError: bad batch", reason="error")
    ran_out = Place(1, "paused", 8, 6.0, failure="the data ran out in step 9: StopIteration at train.py:12 (...)",
                    reason="data exhausted")
    assert waited_for(own, {0: own, 1: failed}) == "rank 1 (its step failed)"
    assert waited_for(own, {0: own, 1: ran_out}) == "rank 1 (its data ran out)"
    assert waited_for(own, {0: own, 1: Place.from_json(ran_out.to_json())}) == "rank 1 (its data ran out)"  # via the store
