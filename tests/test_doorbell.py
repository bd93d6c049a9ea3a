"""The doorbell (workbench/engine/doorbell.py): rank 0 and rank 1 as two objects on one real TCPStore.

Each test drives the ranks' turns by hand, so every interleaving that matters is reached on purpose: a rank
that hears in time and agrees, one already past the proposed turn, one that never answers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from workbench.engine import doorbell
from workbench.engine.doorbell import ANSWER_WAIT_SECONDS, Doorbell

TIMEOUT = timedelta(seconds=10)


@pytest.fixture
def bells():
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=TIMEOUT)
    zero = Doorbell(dist.PrefixStore("t", server), 0, 2, TIMEOUT)
    one = Doorbell(dist.PrefixStore("t", client), 1, 2, TIMEOUT)
    zero.wanted = True
    zero.set_turn_seconds(0.1)  # long turns: the proposal is for rank 0's next boundary
    yield zero, one
    zero.close()
    one.close()


def heard(bell: Doorbell) -> tuple[int, int]:
    deadline = time.monotonic() + 5
    while bell._proposal is None:
        assert time.monotonic() < deadline, "rank 1 never heard the proposal"
        time.sleep(0.001)
    return bell._proposal


def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    return thread, out


def test_a_rank_that_hears_in_time_exchanges_with_rank_0_at_the_proposed_turn(bells):
    zero, one = bells
    assert zero.at_boundary(10) is False and one.at_boundary(10) is False  # nothing rung: nothing happens
    zero.ring()
    assert heard(one) == (1, 11)
    thread, got = in_thread(one.at_boundary, 11)  # rank 1 agrees, then waits for rank 0's decision
    assert zero.at_boundary(11) is True
    thread.join(5)
    assert got == [True]
    zero.ring()  # the next command: a new proposal, heard as the next one
    assert heard(one) == (2, 12)


def test_a_rank_past_the_proposed_turn_says_no_and_neither_rank_exchanges_early(bells):
    zero, one = bells
    zero.at_boundary(10)
    zero.ring()
    heard(one)
    assert one.at_boundary(12) is False  # it heard the proposal for turn 11 only at turn 12
    assert zero.at_boundary(11) is False
    zero.ring()
    assert heard(one)[0] == 2  # the listener went on to the next proposal


def test_a_declined_proposal_is_retried_further_ahead_and_agreed_there(bells):
    zero, one = bells
    zero.at_boundary(10)
    zero.ring()
    heard(one)
    assert one.at_boundary(12) is False  # past turn 11: no
    assert zero.at_boundary(11) is False and zero.declined  # the command is still queued on rank 0
    zero.retry()  # what the lockstep does at that boundary
    assert not zero.declined
    assert heard(one) == (2, 13)  # twice as far ahead as the first proposal (turn 11 + 2)
    thread, got = in_thread(one.at_boundary, 13)
    assert zero.at_boundary(12) is False and zero.at_boundary(13) is True
    thread.join(5)
    assert got == [True]
    assert not zero.declined and zero._misses == 0  # agreed: the next command starts one turn ahead again
    zero.ring()
    assert heard(one) == (3, 14)


def test_a_command_queued_on_rank_1_has_rank_0_propose_a_turn(bells):
    """Rank 1's own commands (its pause after a failed step, its memory guard) do not wait for the cadence either."""
    zero, one = bells
    zero.at_boundary(10)
    one.ring()  # rank 1 asks through the store; rank 0's listener hears it and proposes rank 0's next boundary
    assert heard(one) == (1, 11)
    thread, got = in_thread(one.at_boundary, 11)
    assert zero.at_boundary(11) is True
    thread.join(5)
    assert got == [True]
    deadline = time.monotonic() + 5
    while zero.store.check(["request/1"]):  # the request's key is deleted once heard
        assert time.monotonic() < deadline, "the request's key stayed in the store"
        time.sleep(0.01)
    one.ring()
    assert heard(one) == (2, 12)  # the next request: the next proposal


def test_a_rank_that_asked_holds_at_its_boundary_for_a_proposal_at_its_own_turn(bells):
    """A paused rank's turns take no time: before the hold it raced past any turn rank 0 proposed, and its pause waited
    for the cadence's exchange. Now it takes no turn past the one it named before it hears the proposal."""
    zero, one = bells
    zero.wanted = False  # rank 0 paused: its own commands do not ring, but another rank's request still does
    zero.at_boundary(10)
    assert one.at_boundary(50) is False  # rank 1 races ahead: 40 turns ahead of rank 0
    thread, got = in_thread(lambda: (one.ring(), one.at_boundary(51))[1])  # it asks, then reaches its next boundary
    deadline = time.monotonic() + 5
    while zero._proposal is None:  # the proposal is for rank 1's turn, not rank 0's next one
        assert time.monotonic() < deadline, "rank 0 never proposed"
        time.sleep(0.001)
    assert zero._proposal == (1, 51)
    for turn in range(11, 51):
        assert zero.at_boundary(turn) is False
    assert zero.at_boundary(51) is True
    thread.join(5)
    assert got == [True]
    assert not one._asked and one.at_boundary(52) is False  # served: no more holding


def test_a_request_an_open_proposal_cannot_serve_gets_a_proposal_of_its_own(bells):
    zero, one = bells
    zero.at_boundary(10)
    zero.ring()  # rank 0's own command: turn 11
    heard(one)
    assert one.at_boundary(20) is False  # rank 1 is past it: no
    one.ring()  # rank 1 now asks for a turn (it holds at 21) while rank 0's proposal is still open
    time.sleep(0.1)  # rank 0's listener heard it: one proposal open at a time, so it waits for the decision
    assert zero.at_boundary(11) is False  # declined; rank 0's own command aside, the request still wants a turn
    assert heard(one) == (2, 21)
    thread, got = in_thread(one.at_boundary, 21)
    for turn in range(12, 21):
        assert zero.at_boundary(turn) is False
    assert zero.at_boundary(21) is True
    thread.join(5)
    assert got == [True]


def test_a_rank_that_asked_holds_no_longer_than_hold_seconds(bells, monkeypatch):
    """Rank 0 gone (its listener closed): the asking rank goes on after HOLD_SECONDS, and holds only once."""
    monkeypatch.setattr(doorbell, "HOLD_SECONDS", 0.3)
    zero, one = bells
    zero.close()
    one.ring()
    started = time.monotonic()
    assert one.at_boundary(1) is False
    assert 0.25 <= time.monotonic() - started < 3
    started = time.monotonic()
    assert one.at_boundary(2) is False and one.at_boundary(3) is False
    assert time.monotonic() - started < 0.1


def test_rank_0_decides_no_when_an_answer_does_not_come_and_a_late_yes_learns_it(bells, capfd):
    zero, one = bells
    zero.at_boundary(10)
    zero.ring()
    heard(one)
    started = time.monotonic()
    assert zero.at_boundary(11) is False  # rank 1 has not reached a boundary: rank 0 waits ANSWER_WAIT_SECONDS at most
    assert time.monotonic() - started < ANSWER_WAIT_SECONDS + 1
    assert one.at_boundary(11) is False  # it agreed, then read rank 0's decision: no
    assert "timed out" not in capfd.readouterr().err  # an ordinary miss prints nothing (a c10d wait would warn)


def test_short_turns_propose_a_turn_further_ahead(bells):
    zero, one = bells
    zero.set_turn_seconds(0.0015)
    zero.at_boundary(10)
    zero.ring()
    assert heard(one) == (1, 12)  # one turn of slack for a rank through its boundary before rank 0's
    assert zero.at_boundary(11) is False and one.at_boundary(11) is False  # agreed, waiting for turn 12
    thread, got = in_thread(one.at_boundary, 12)
    assert zero.at_boundary(12) is True
    thread.join(5)
    assert got == [True]


def test_only_one_proposal_is_open_and_none_while_not_training(bells):
    zero, one = bells
    zero.wanted = False
    zero.ring()
    time.sleep(0.05)
    assert one._proposal is None and zero._proposal is None
    zero.wanted = True
    zero.ring()
    zero.ring()  # a second command before the turn: the open proposal carries both
    assert heard(one) == (1, 1)
    assert zero._k == 1


def test_closing_lets_the_listener_and_a_waiting_rank_go(bells):
    zero, one = bells
    zero.at_boundary(10)
    zero.ring()
    heard(one)
    assert one.at_boundary(10) is False  # agreed to turn 11
    thread, got = in_thread(one.at_boundary, 11)
    zero.close()  # rank 0 ends before turn 11: its decision is no
    thread.join(5)
    assert got == [False]
    listeners = [t for t in threading.enumerate() if t.name == "vram-bench-doorbell"]
    one.close()
    for listener in listeners:
        listener.join(5)
        assert not listener.is_alive()


def test_closing_a_rank_that_heard_a_proposal_it_has_not_answered_does_not_wait_for_the_listener(bells, monkeypatch):
    """A stop that comes between hearing a proposal and its turn: the listener waited for the answer until
    CLOSE_SECONDS ran out (rank 1 exited 2 s after rank 0 at every SIGTERM stop)."""
    zero, one = bells
    monkeypatch.setattr(doorbell, "CLOSE_SECONDS", 60.0)
    zero.at_boundary(10)
    zero.ring()
    heard(one)  # heard, never answered: rank 1 is told to stop before its next boundary
    listeners = [t for t in threading.enumerate() if t.name == "vram-bench-doorbell"]
    closing, _ = in_thread(one.close)
    closing.join(10)
    assert not closing.is_alive(), "close() waited for the listener's answer wait"
    assert not any(listener.is_alive() for listener in listeners if listener is one._listener)


def test_the_keys_of_proposals_every_rank_is_through_with_leave_the_store(bells):
    """Each command used to leave its proposal, answers and decision in torchrun's store for the rest of the job."""
    zero, one = bells

    def agree() -> int:
        zero.ring()
        k, at = heard(one)
        thread, got = in_thread(one.at_boundary, at)
        assert zero.at_boundary(at) is True
        thread.join(5)
        assert got == [True]
        return k

    def kept(k: int) -> list[bool]:
        return [zero.store.check([key]) for key in (f"propose/{k}", f"decision/{k}", f"answer/{k}/1")]

    zero.at_boundary(10)
    assert [agree(), agree()] == [1, 2]
    assert kept(1) == [True, True, True]  # rank 0 learned at proposal 2 that rank 1 is through with 1 ...
    assert agree() == 3  # ... and the next ring deletes its keys, off the training thread
    assert kept(1) == [False, False, False]
    assert kept(2) == [True, True, True] and kept(3) == [True, True, True]  # rank 1 may still be reading these
