"""A stop signal meant for the whole job does not end a DataLoader's workers under a step still running.

torchrun passes SIGTERM (and SIGHUP) to every process of a rank's group (`os.killpg`), so a DataLoader's workers died
with the rank's own stop signal while the step the stop lets finish still waited for their next batch. That step
failed on one rank; under DDP the other ranks then waited in the gradient all-reduce until --collective-timeout, and
the stop ended "stuck", without its final snapshot. PyTorch's workers already shrug off ctrl+c (SIGINT) for the same
reason: the main process decides. So a DataLoader worker this process forked ignores the stop signals while its
parent, this process, is alive and has not begun to end its children itself (`begin_ending_children`); after that it
exits, and once orphaned the signal does what it does by default.

Only DataLoader workers: torch's worker set-up (which puts in its own SIGTERM handler, in C: die unless the parent
sent it) is wrapped (`keep_data_loader_workers`). Other forked children keep the default: a `multiprocessing.Pool`'s
`terminate()` ends its workers with SIGTERM and then waits for them. Only workers forked from this process have it
(the default start method on Linux up to Python 3.13; a DataLoader with `multiprocessing_context="spawn"` starts fresh
interpreters).
"""

from __future__ import annotations

import mmap
import os
import signal
from collections.abc import Callable
from functools import partial

# One byte of memory shared with every child forked after import (an anonymous shared mapping survives fork shared,
# unlike a Python variable): 1 once this process has begun ending its children.
_ending = mmap.mmap(-1, 1)


def begin_ending_children() -> None:
    """From now on a stop signal ends the forked children: this process is ending them (quit_escalation.py)."""
    _ending[0] = 1


def child_keeps_running(owner: int) -> bool:
    """In a forked child of `owner` that got a stop signal: ignore it (the owner ends this child when it stops)?"""
    return os.getppid() == owner and _ending[0] == 0


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def keep_data_loader_workers(owner: int) -> Callable[[], None]:
    """From now on, DataLoader workers forked from this process (`owner`) keep running through a stop signal sent to
    the whole group, until `owner` ends them: torch's worker set-up is wrapped to put this handler in after its own.
    Returns what puts torch's own set-up back (for a process that runs more than one session, as tests do)."""
    from torch.utils.data._utils import signal_handling

    original = getattr(signal_handling, "_set_worker_signal_handlers", None)
    if original is None or getattr(original, "vram_bench_owner", None) is not None:
        return lambda: None  # a torch without it (nothing to wrap), or wrapped already

    def set_worker_signal_handlers(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)
        for signum in STOP_SIGNALS:
            signal.signal(signum, partial(_in_data_loader_worker, owner))
        return result

    set_worker_signal_handlers.vram_bench_owner = owner  # type: ignore[attr-defined]
    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers
    put_back_shutdown = _kill_what_shutdown_leaves(owner)

    def put_back() -> None:
        signal_handling._set_worker_signal_handlers = original
        put_back_shutdown()

    return put_back


def _kill_what_shutdown_leaves(owner: int) -> Callable[[], None]:
    """torch's iterator shutdown ends a worker that did not exit within its 5 s wait with `terminate()`: a SIGTERM,
    which the handler above ignores while its owner lives. Left so, the worker lived on (found porting
    pytorch/examples' imagenet trainer: one more worker process after every rebuild), so what is still alive after
    the shutdown is killed."""
    from torch.utils.data import dataloader

    iterator = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    original = getattr(iterator, "_shutdown_workers", None)
    if original is None or getattr(original, "vram_bench_owner", None) is not None:
        return lambda: None

    def shutdown_workers(self: object) -> None:
        try:
            original(self)
        finally:
            if os.getpid() == owner:  # not a forked copy of the iterator, freed in a child
                for process in getattr(self, "_workers", ()):
                    if process.is_alive():
                        process.kill()
                        process.join(timeout=1)

    shutdown_workers.vram_bench_owner = owner  # type: ignore[attr-defined]
    iterator._shutdown_workers = shutdown_workers  # type: ignore[union-attr]

    def put_back() -> None:
        iterator._shutdown_workers = original  # type: ignore[union-attr]

    return put_back


def _in_data_loader_worker(owner: int, signum: int, frame: object) -> None:
    if child_keeps_running(owner):
        return
    if os.getppid() == owner:
        os._exit(0)  # `owner` is ending its workers: a clean exit, as torch's own handler makes for its parent's SIGTERM
    signal.signal(signum, signal.SIG_DFL)  # orphaned: what the signal does by default
    os.kill(os.getpid(), signum)
