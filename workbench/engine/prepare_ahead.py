"""Ranks > 0 prepare a saved file's change while they train, not at the boundary that applies it.

A saved file crosses to every rank as its source, in the exchange the doorbell brings forward
(workbench/engine/lockstep.py), and each rank prepared its plan from it there, on its training
thread, while every other rank waited in the agreement that follows: on 2 cores, sighting -> applied
took 16 ms under torchrun against 4.5 ms for one process, most of it that preparation. Now rank 0's
reload thread, as it queues a change, also posts its source to the job's store (`source/n`); a
thread on each other rank waits there and prepares the same plan at once, so at the agreed boundary
the plan is ready, or nearly. The exchange's copy of the source stays the authority: a plan made
ahead is used only for the very same bytes, and a rank without one prepares at the boundary as
before. The source crosses as UTF-8 text, never pickled.

Each `source/n` is read once by every rank > 0; the last to read it deletes it, so the job's store
does not keep a copy of every save.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Generic, TypeVar

import torch.distributed as dist

P = TypeVar("P")  # a plan (ChangeSet); generic so this module needs nothing of the reloader

CLOSED = b"closed"
LISTEN_TIMEOUT = timedelta(hours=24)  # one wait of the listener (c10d warns when a wait times out: rarely, then)
MAX_KEPT = 8  # plans made ahead and not yet taken (a change always follows its announcement; this bounds a lost one)
TAKE_SECONDS = 60.0  # how long the training thread waits for a plan still being made before making its own
CLOSE_SECONDS = 2.0


class PrepareAhead(Generic[P]):
    """One rank's side: rank 0 announces sources; every other rank prepares them on a thread of its own.

    `prepare(path, source)`: the rank's planning (the reloader's prepare, from the given bytes); None, or a raised
    error, leaves the boundary to plan as before."""

    def __init__(self, store: dist.Store, rank: int, world_size: int,
                 prepare: Callable[[str, str], P | None]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.prepare = prepare
        # A store client answers one request at a time: the listener's long wait has a client of its own.
        self._store = store.clone()  # rank 0: the reload thread's announcements; ranks > 0: closing
        self._listen_store = store.clone() if rank != 0 else None
        self._plans: OrderedDict[tuple[str, str], Future[P | None]] = OrderedDict()
        self._lock = threading.Lock()  # the plans: made by the listener, taken by the training thread
        self._closed = threading.Event()
        self._announced = 0
        self._listen_n = 1
        self._listen_lock = threading.Lock()
        self._listener: threading.Thread | None = None
        if rank != 0 and world_size > 1:
            self._listener = threading.Thread(target=self._listen, name="vram-bench-prepare-ahead", daemon=True)
            self._listener.start()

    # Rank 0 ----------------------------------------------------------------------------
    def announce(self, path: str, source: str) -> None:
        """Rank 0's reload thread, as it has read a saved file and before it plans it: every other rank starts planning
        it now. Best effort: a store that fails leaves every rank to plan at the boundary."""
        if self.rank != 0 or self.world_size < 2 or self._closed.is_set():
            return
        self._announced += 1
        try:
            self._store.set(f"source/{self._announced}", path.encode() + b"\0" + source.encode())
        except Exception:  # noqa: BLE001 - the store is torchrun's: gone means the job is going
            pass

    # Ranks > 0 -------------------------------------------------------------------------
    def take(self, path: str, source: str) -> P | None:
        """The training thread, at the boundary that applies `source`: the plan made ahead from exactly these bytes
        (waiting for it if it is being made), or None: then the boundary plans as before."""
        with self._lock:
            future = self._plans.pop((path, source), None)
        if future is None:
            return None
        try:
            return future.result(TAKE_SECONDS)
        except Exception:  # noqa: BLE001 - planning ahead failed or took too long: plan at the boundary, as before
            return None

    def _listen(self) -> None:
        """Wait in the store for each announced source and plan it."""
        while not self._closed.is_set():
            with self._listen_lock:
                n = self._listen_n
            value = self._wait_for(f"source/{n}")
            if value is None:
                continue
            if value == CLOSED:
                return
            with self._listen_lock:
                self._listen_n = n + 1
            self._forget_when_all_read(n)
            path_bytes, _, source_bytes = value.partition(b"\0")
            path, source = path_bytes.decode(errors="replace"), source_bytes.decode(errors="replace")
            future: Future[P | None] = Future()
            with self._lock:
                self._plans[(path, source)] = future
                while len(self._plans) > MAX_KEPT:
                    self._plans.popitem(last=False)
            future.set_running_or_notify_cancel()
            try:
                future.set_result(self.prepare(path, source))
            except BaseException as exc:  # noqa: BLE001 - the training thread plans again and reports it as before
                future.set_exception(exc)

    def _forget_when_all_read(self, n: int) -> None:
        """The last rank to read `source/n` deletes it (and its count)."""
        try:
            assert self._listen_store is not None
            if self._listen_store.add(f"read/{n}", 1) >= self.world_size - 1:
                self._listen_store.delete_key(f"source/{n}")
                self._listen_store.delete_key(f"read/{n}")
        except Exception:  # noqa: BLE001 - the store going with the job: nothing to clean
            pass

    def _wait_for(self, key: str) -> bytes | None:
        assert self._listen_store is not None
        try:
            self._listen_store.wait([key], LISTEN_TIMEOUT)
            return bytes(self._listen_store.get(key))
        except Exception:  # noqa: BLE001 - the store failed (the job is ending) or a very long quiet: look again
            self._closed.wait(1.0)
            return None

    def close(self) -> None:
        """This rank is done with these groups: the listener stops (woken with its own key). Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._listener is None:
            return
        try:
            with self._listen_lock:
                key = f"source/{self._listen_n}"
            self._store.compare_set(key, "", CLOSED.decode())  # never overwrites a real source
        except Exception:  # noqa: BLE001 - the store is gone with the job: its waits have ended too
            pass
        if self._listener is not threading.current_thread():
            self._listener.join(CLOSE_SECONDS)
