"""Let the screen win the CPU: `--training-nice N` runs the training thread at a lower priority.

Why: on a machine whose cores are all busy training (CPU training, or a Python-heavy
loop feeding a GPU), the UI thread waits its turn behind the training thread and its
intra-op threads, and a key takes a visible while to reach the screen. Linux keeps a
nice value per thread, and threads (torch's intra-op pool, DataLoader workers) inherit
it from the thread that starts them, so lowering the training thread before setup()
lowers all of its helpers.

It is off by default: measured on 2 cores (bench/RESULTS.md), nice 5 took help's
key-to-screen p95 from 171 to 113 ms but cost about 7% of steps/s in the TUI, since
the UI and the terminal then preempt one of the intra-op threads mid-operation and
the other waits for it; other processes on the machine also come first.
"""

from __future__ import annotations

import os
import sys
import threading

MAX_NICE = 19


def lower_current_thread(by: int) -> int | None:
    """Raise the calling thread's nice value by `by` (Linux only); the new value, or None if unchanged."""
    if by <= 0 or not sys.platform.startswith("linux"):
        return None
    try:
        tid = threading.get_native_id()
        nice = min(os.getpriority(os.PRIO_PROCESS, tid) + by, MAX_NICE)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
        return nice
    except OSError:  # a sandbox without setpriority: run as before
        return None
