"""Short full garbage collections: freeze what is alive once setup() is done.

Why: after setup the process holds a few hundred thousand long-lived objects (torch,
Textual, the model). Every full (generation 2) collection walks all of them with the
GIL held: 150-250 ms on a small machine, at random moments, stalling both the
training step and the UI (a key press waits it out). `gc.freeze()` moves the
survivors into the permanent generation, which collections skip, so a full
collection walks only what was created since: tens of milliseconds.

The price, and how it is paid:
- Cyclic garbage among frozen objects is not collected while frozen. The moments
  that must free everything (cleanup, rebuild, out of memory) use `collect_all`,
  which thaws, collects and freezes again.
- `gc.get_objects` and `gc.get_referrers` do not see frozen objects, so the leak
  finder runs inside `thawed()`.
- Freezing is process-wide. `release` gives it back when the session ends, so a
  process that runs several sessions (the tests) does not keep their objects.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Frozen:
    objects: int  # in the permanent generation afterwards


def freeze_survivors() -> Frozen:
    """Collect, then freeze every survivor: only live objects are frozen, never garbage."""
    gc.collect()
    gc.freeze()
    return Frozen(objects=gc.get_freeze_count())


def is_frozen() -> bool:
    return gc.get_freeze_count() > 0


def collect_all() -> int:
    """A full collection that includes frozen objects (which stay frozen if they survive)."""
    if not is_frozen():
        return gc.collect()
    gc.unfreeze()
    try:
        return gc.collect()
    finally:
        gc.freeze()


@contextmanager
def thawed() -> Iterator[None]:
    """Every object visible to `gc.get_objects` / `gc.get_referrers` inside the block.

    On the way out the block's own cyclic garbage is collected before freezing again.
    """
    if not is_frozen():
        yield
        return
    gc.unfreeze()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()


def release() -> None:
    """Back to ordinary collection: frozen objects rejoin the oldest generation."""
    gc.unfreeze()
