"""Keep every other Python thread off the GIL while a block holds references to objects it did not make.

`gc.get_objects()` and `gc.get_referrers()` return every tracked object, including a tuple another thread is still
building: `tuple(x for x in ...)` allocates the tuple, fills it while the generator runs (and the GIL may pass to
another thread), then shrinks it in place, which CPython allows only while nothing else refers to it. If that thread
resumes while our list still holds the tuple, its `tuple(...)` raises "SystemError: bad argument to internal
function": a sampler, a socket writer or a user's thread failing for no reason of its own (the leak finder did this
to the app's chart in the full suite, and to a test thread every time).

CPython has no stop-the-world call for Python code, but a thread waiting for the GIL takes it from a running thread
only after the switch interval (5 ms by default); otherwise only when the running thread blocks. So for the block the
interval is made long (`HOLD_SECONDS`), after one short sleep that lets every thread which asked before have its turn
(and so ask again only on the long interval). The other threads then run again only if the block blocks (I/O, a
lock), which the leak finder does not, or if it outlasts `HOLD_SECONDS`. The interval is bounded because a thread
that never blocks (a busy user thread) takes the GIL at that sleep and gives it back only when asked: the block then
starts up to `HOLD_SECONDS` late, rather than never. The leak finder runs on demand, between steps, for well under a
second.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

HOLD_SECONDS = 1.0  # the switch interval inside the block: how long the block has the GIL to itself, at least
HANDOVER_SECONDS = 0.001  # one sleep before the block: a thread that already asked for the GIL takes it now


@contextmanager
def other_threads_held() -> Iterator[None]:
    """Run the block without the GIL passing to another thread (unless the block itself blocks)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(HOLD_SECONDS)
    try:
        time.sleep(HANDOVER_SECONDS)  # every waiter saw the GIL change hands: none of them asks on the old interval
        yield
    finally:
        sys.setswitchinterval(before)
