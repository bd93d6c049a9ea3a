"""Rank 0 brings the next exchange forward when a command arrives, so a save is not held for the cadence.

While training, the ranks exchange about EXCHANGE_SECONDS apart (workbench/engine/lockstep.py), and an
exchange's rows are collected a turn after they are posted; a command (a saved file, a key) waited for both.
The doorbell makes it start at rank 0's next boundary or the one after, at no cost per step:

1. When a command is queued on rank 0 (any thread), rank 0 proposes turn P: its next boundary, or a few ahead
   when turns are shorter than the store's round trips (`propose/k = P`). A command queued on another rank (its
   pause after a failed step, its memory guard, a signal) asks rank 0 to do so (`request/m = "rank:turn"`, heard by
   a thread of rank 0's that waits in the store), and that rank holds at its next boundary until it hears the
   proposal (HOLD_SECONDS at most), which is for a turn no earlier than the one it holds at. Without the hold, a
   paused rank, whose turns take no time, raced past any turn rank 0 could propose and its pause waited for the
   cadence's exchange.
2. Every other rank hears it on a thread of its own (blocked in the store, not polling it) and answers at its
   next boundary: yes if it has not passed P (then it will exchange at P), no otherwise (`answer/k/rank`).
3. Rank 0, at turn P, waits a few milliseconds at most for the answers and decides: yes only when every rank
   said yes (`decision/k`). Each rank that said yes reads the decision at its turn P. On yes, every rank
   exchanges at P and collects it at once, so the command runs at P everywhere; on no, nothing changed, and
   rank 0 proposes again, twice as far ahead each time a proposal misses (`retry`; for another rank's request,
   until a proposal made after it is agreed), so a command is not left to the cadence's exchange, which is a
   quarter of a second apart.

No rank waits unboundedly on one that may be inside a step waiting for it: rank 0's wait for answers is
capped (a rank already past P may be inside a collective waiting for rank 0), and a rank that said yes waits
at P only for rank 0's decision, which rank 0 makes at its own turn P; rank 0 can reach P, since the waiting
rank has trained every step up to P.

The messages go through the job's c10d store (torchrun's TCPStore): keys, not collectives, so no rank has to
join anything to keep the others going. A command costs a few store round trips (0.1-0.3 ms each); between
commands nothing happens.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from workbench.engine.control_plane import RanksLost

T = TypeVar("T")

MARGIN_SECONDS = 0.001  # P is at least this far ahead: the proposal's trip through the store to every rank
SHORT_TURN_SECONDS = 0.01  # below this, a rank is often a turn ahead of rank 0 (done with its step's tail first)
ANSWER_WAIT_SECONDS = 0.005  # rank 0 at P: how long it waits for answers not in yet
ANSWER_POLL_SECONDS = 0.0002
MAX_RETRY_DOUBLINGS = 4  # a retried proposal looks at most 16x further ahead than the first
HOLD_SECONDS = 1.0  # ranks > 0: how long a rank that asked for a turn waits at its boundary to hear it (normally ms)
CLOSE_SECONDS = 2.0  # how long closing waits for the listener to end
LISTEN_TIMEOUT = timedelta(hours=24)  # one wait of the listener (c10d warns when a wait times out: rarely, then)


class Doorbell:
    """One rank's side of the doorbell, on a store of its own (a prefix per process-group generation)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        # A store client answers one request at a time: each thread has its own (Store.clone), so the listener's
        # long wait never holds up the training thread's, nor torch's own use of the job's store.
        self.store = store.clone()  # the training thread's
        self._ring_store = store.clone()  # the threads that queue commands' (rank 0 proposes; ranks > 0 ask it to)
        self._listen_store = store.clone()  # the listener's: proposals (ranks > 0), other ranks' requests (rank 0)
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.wanted = False  # rank 0, set by the training thread at each exchange: it is training (else no ringing)
        self._turns_ahead = 1
        self._misses = 0  # rank 0: proposals in a row that some rank could not take (each retry looks further ahead)
        self.declined = False  # rank 0: the last decision was no; the command it was for may still be queued
        self._lock = threading.Lock()  # rank 0: the open proposal and the turn
        self._ring_lock = threading.Lock()  # rank 0: one ringing thread at a time on the ring store
        self._turn = 0  # the last boundary's turn
        self._requests_heard = 0  # rank 0: requests from other ranks so far
        self._requests_served = 0  # rank 0: requests heard before the last agreed proposal was made
        self._requests_in_proposal = 0  # rank 0: requests heard when the open proposal was made
        self._request_turn = 0  # rank 0: the latest turn a requesting rank holds at (a proposal is for no earlier one)
        self._asked = False  # ranks > 0: this rank asked for a turn and has not exchanged at an agreed one since
        self._hold_until = 0.0  # ranks > 0: monotonic time until which this rank holds for the proposal it asked for
        self._heard = threading.Event()  # ranks > 0: the listener has a proposal for the training thread
        self._k = 0  # rank 0: proposals made
        self._kept_from = 1  # rank 0: the oldest proposal whose keys are still in the store
        self._forgotten: list[str] = []  # rank 0: keys of finished proposals, for the next ring to delete
        self._proposal: tuple[int, int] | None = None  # (k, P): rank 0's open one, or one this rank heard
        self._accepted_at: int | None = None  # ranks > 0: the turn this rank agreed to exchange at
        self._closed = threading.Event()
        self._answered = threading.Event()  # ranks > 0: the proposal heard is answered; listen for the next
        self._listen_k = 1  # ranks > 0: the proposal the listener waits for; rank 0: the request it waits for
        self._listen_lock = threading.Lock()  # the listener's key, read by `close` to wake it
        self._listener = threading.Thread(target=self._listen if rank != 0 else self._hear_requests,
                                          name="vram-bench-doorbell", daemon=True)
        self._listener.start()

    # Rank 0 -----------------------------------------------------------------------------
    def set_turn_seconds(self, seconds: float) -> None:
        """The training thread's measured turn: P is at least MARGIN_SECONDS away, and a turn further when turns
        are short: a rank past P cannot take part (measured: with 1.5 ms turns, P one turn ahead missed 4 times in 8,
        rank 1 being through its boundary before rank 0's)."""
        self._turns_ahead = max(1, math.ceil(MARGIN_SECONDS / max(seconds, 1e-6))) + (seconds < SHORT_TURN_SECONDS)

    def ring(self) -> None:
        """Any thread: a command was queued. Rank 0 proposes an exchange soon (once per open proposal); another rank
        asks rank 0 to (its own pause after a failed step, its memory guard, a signal)."""
        if self.rank != 0:
            self._request()
            return
        if self._closed.is_set():
            return
        with self._lock:
            requested = self._requests_heard > self._requests_served
            if self._proposal is not None or not (self.wanted or requested):
                return  # one open at a time; rank 0's own commands only while training (else every turn exchanges)
            self._k += 1
            ahead = self._turns_ahead * 2 ** min(self._misses, MAX_RETRY_DOUBLINGS)
            k, at = self._k, max(self._turn + ahead, self._request_turn)  # a requesting rank holds at its turn
            self._proposal = (k, at)
            self._requests_in_proposal = self._requests_heard
            forgotten, self._forgotten = self._forgotten, []
        try:
            with self._ring_lock:
                self._ring_store.set(f"propose/{k}", str(at))
                for key in forgotten:
                    self._ring_store.delete_key(key)
        except Exception:  # noqa: BLE001 - the store gone: at P nobody answered, so the cadence carries the command
            pass

    def retry(self) -> None:
        """Rank 0, at a boundary where its proposal was declined and a command is still queued: propose again."""
        self.declined = False
        self.ring()

    def _hear_requests(self) -> None:
        """Rank 0's listener: each request a rank > 0 makes (`request/m`, numbered by a counter in the store) rings,
        for a turn no earlier than the one the rank holds at."""
        while True:
            with self._listen_lock:
                if self._closed.is_set():
                    return
                m = self._listen_k
            value = self._wait_for(f"request/{m}")
            if value is None:
                continue
            with self._listen_lock:
                self._listen_k = m + 1
            if value == b"closed":
                return
            try:
                self._listen_store.delete_key(f"request/{m}")
            except Exception:  # noqa: BLE001 - the store going with the job: nothing to clean
                pass
            _, _, turn = value.decode(errors="replace").partition(":")
            with self._lock:
                self._requests_heard += 1
                self._request_turn = max(self._request_turn, int(turn) if turn.isdigit() else 0)
            self.ring()

    # Every rank, at each boundary -------------------------------------------------------
    def at_boundary(self, turn: int) -> bool:
        """True: every rank exchanges at this turn, and collects the exchange at once."""
        if self.rank == 0:
            with self._lock:
                self._turn = turn
                proposal = self._proposal
                if proposal is None or turn < proposal[1]:
                    return False
                self._proposal = None
                requests = self._requests_in_proposal  # read with the proposal: a listener may make the next one now
            agreed = self._decide(*proposal, turn)
            if agreed:
                with self._lock:
                    self._requests_served = max(self._requests_served, requests)
            if self._requests_heard > self._requests_served:
                self.ring()  # another rank's request that this proposal did not serve: a turn for it
            return agreed
        self._turn = turn
        if self._asked and self._proposal is None and self._accepted_at is None:
            wait = self._hold_until - time.monotonic()
            if wait > 0:  # this rank asked for a turn: it takes no step past it before it hears the proposal
                self._heard.wait(wait)
        if self._proposal is None:
            return False
        k, at = self._proposal
        if self._accepted_at is None:  # heard by the listener since the last boundary: answer now
            accept = turn <= at
            self._set(f"answer/{k}/{self.rank}", "1" if accept else "0")
            if not accept:
                self._done_with_proposal()
                return False
            self._accepted_at = at
        if turn < self._accepted_at:
            return False
        agreed = self._read_decision(k)
        self._accepted_at = None
        self._done_with_proposal()
        if agreed:
            self._asked, self._hold_until = False, 0.0  # this exchange carries what was queued when this rank asked
        elif self._asked:
            self._hold_until = time.monotonic() + HOLD_SECONDS  # rank 0 proposes again for the request
        return agreed

    def _decide(self, k: int, at: int, turn: int) -> bool:
        """Rank 0 at P: yes when every rank answered yes within ANSWER_WAIT_SECONDS."""
        answers = [f"answer/{k}/{rank}" for rank in range(1, self.world_size)]
        agreed = turn == at
        all_in = False
        if agreed and answers:
            all_in = self._all_answered(answers)
            agreed = all_in and all(bytes(v) == b"1" for v in self._store_call(lambda: self.store.multi_get(answers)))
        self._set(f"decision/{k}", "1" if agreed else "0")
        if all_in:
            self._forget_before(k)
        self._misses = 0 if agreed else self._misses + 1
        self.declined = not agreed
        return agreed

    def _forget_before(self, k: int) -> None:
        """Every rank answered proposal k: each is done with every earlier one (a rank takes proposals in order and
        hears the next only once it is through with the last, its decision read), so their keys can go. Without
        this, each command left a few keys in torchrun's store for the rest of the job."""
        keys = [key for j in range(self._kept_from, k)
                for key in (f"propose/{j}", f"decision/{j}", *(f"answer/{j}/{r}" for r in range(1, self.world_size)))]
        self._kept_from = k
        with self._lock:
            self._forgotten.extend(keys)  # deleted by the next ring, off the training thread (a round trip each)

    def _all_answered(self, keys: list[str]) -> bool:
        """Whether every answer is in within ANSWER_WAIT_SECONDS. Checked, not waited for: c10d prints a warning for each
        wait that times out, and a rank past the turn is an ordinary case, not one to print."""
        deadline = time.monotonic() + ANSWER_WAIT_SECONDS
        while not self._store_call(lambda: self.store.check(keys)):
            if time.monotonic() >= deadline:
                return False  # a rank past P, or slow: no; the cadence's exchange carries the command
            time.sleep(ANSWER_POLL_SECONDS)
        return True

    def _store_call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the store is torchrun's: gone means the job is going
            raise RanksLost(f"the job's store failed ({exc}): another rank or the launcher went away") from exc

    def close(self) -> None:
        """This rank is done with these groups (the end, or new groups): its listener stops, and rank 0 lets any
        rank that said yes to an open proposal go. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._asked, self._hold_until = False, 0.0
        self._heard.set()  # a training thread holding for a proposal goes on
        self._answered.set()  # a listener waiting for a heard proposal's answer ends now, not CLOSE_SECONDS later
        try:
            if self.rank == 0:
                with self._lock:
                    proposal, self._proposal = self._proposal, None
                if proposal is not None:
                    self.store.set(f"decision/{proposal[0]}", "0")
            # The listener waits in the store: wake it with its own key (never overwriting a real proposal or request;
            # a listener woken by one of those sees `_closed` before it waits again).
            with self._listen_lock:
                key = f"propose/{self._listen_k}" if self.rank != 0 else f"request/{self._listen_k}"
            self.store.compare_set(key, "", "closed")
        except Exception:  # noqa: BLE001 - the store is gone with the job: its waits have ended too
            pass
        if self._listener is not None and self._listener is not threading.current_thread():
            self._listener.join(CLOSE_SECONDS)

    # Ranks > 0 ---------------------------------------------------------------------------
    def _listen(self) -> None:
        """Wait in the store for the next proposal; the training thread answers it at its next boundary. The wait
        has no short timeout (c10d warns at each one): `close` sets the awaited key to end it."""
        while not self._closed.is_set():
            value = self._wait_for(f"propose/{self._listen_k}")
            if value is None:
                continue
            if value == b"closed":
                return
            self._answered.clear()
            self._proposal = (self._listen_k, int(value))
            self._heard.set()
            self._listen_k += 1
            while not self._answered.wait(CLOSE_SECONDS) and not self._closed.is_set():
                pass

    def _wait_for(self, key: str) -> bytes | None:
        """A listener's wait for `key` in the store, and its value; None when the store failed (the job is ending)
        or after a very long quiet: the listener looks again."""
        started = time.monotonic()
        try:
            self._listen_store.wait([key], LISTEN_TIMEOUT)
            return bytes(self._listen_store.get(key))
        except Exception:  # noqa: BLE001 - see above
            if time.monotonic() - started < 1.0:
                self._closed.wait(1.0)  # a store that fails at once: no busy loop
            return None

    def _request(self) -> None:
        """Ranks > 0, any thread: ask rank 0 to propose a turn (`request/m`, m from a counter every rank adds to), so
        a command queued here does not wait for the cadence's exchange either. The hold starts before the turn is
        read: the training thread holds at that turn's next boundary at the latest, and the request names it."""
        if self._closed.is_set():
            return
        try:
            with self._ring_lock:
                self._asked, self._hold_until = True, time.monotonic() + HOLD_SECONDS
                holds_at = self._turn + 1
                m = self._ring_store.add("requests", 1)
                self._ring_store.set(f"request/{m}", f"{self.rank}:{holds_at}")
        except Exception:  # noqa: BLE001 - the store gone: the job is ending; the cadence's exchange carries it
            pass

    def _done_with_proposal(self) -> None:
        self._proposal = None
        self._heard.clear()
        self._answered.set()

    def _read_decision(self, k: int) -> bool:
        """Ranks > 0 at the agreed turn: rank 0's yes or no (it makes it at that turn; bounded by the control timeout)."""
        key = f"decision/{k}"

        def read() -> bytes:
            self.store.wait([key], self.timeout)
            return bytes(self.store.get(key))

        return self._store_call(read) == b"1"

    def _set(self, key: str, value: str) -> None:
        self._store_call(lambda: self.store.set(key, value))
