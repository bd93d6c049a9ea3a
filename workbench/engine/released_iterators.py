"""A rebuild ends the old state's iterators itself, in order, before the old state is collected.

The old state is a reference cycle more often than not (`state["batches"] = epochs(state)`: the generator's frame
holds the dict that holds it), so the garbage collector frees it, and a DataLoader iterator inside it is freed in the
same sweep as its queues. The queues' finalizers run first; the iterator's shutdown then posts its workers' final
message on a queue whose writer thread has already ended, waits 5 s for them (torch's `MP_STATUS_CHECK_INTERVAL`), and
terminates them. Found porting pytorch/examples' imagenet trainer: every rebuild took 10.2 s, against 0.16 s with no
workers (plain PyTorch shows the same 5 s for an iterator dropped inside a cycle). Closing each old generator and
shutting each DataLoader iterator down before the collection does what reference counting does outside a cycle.
"""

from __future__ import annotations

import gc
from types import GeneratorType
from typing import Any

from workbench.engine.state_walk import top_values


def release_iterators(old_state: Any, new_state: Any) -> list[str]:
    """Close the generators and shut down the DataLoader iterators among `old_state`'s values that `new_state` does not
    hold too. Returns a note for each one whose own clean-up raised (its `finally:`): the rebuild stands."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    kept = {id(value) for _, value in top_values(new_state)}
    problems: list[str] = []
    for label, value in top_values(old_state):
        if id(value) in kept:
            continue
        try:
            if isinstance(value, GeneratorType):
                value.close()  # its frame lets go of the loader iterator it was reading, which shuts down at once
            elif isinstance(value, _BaseDataLoaderIter) and hasattr(value, "_shutdown_workers"):
                value._shutdown_workers()
        except Exception as exc:  # noqa: BLE001 - the user's clean-up code; the new state is in place already
            problems.append(f"closing the old {label} raised {type(exc).__name__}: {exc}")
    return problems


def read_only_by_released(loader: Any, old_state: Any, new_state: Any) -> bool:
    """Whether the iterator `loader` hands out now is read by a generator of `old_state` that `release_iterators`
    closes: a loader the rebuild does not make again (a module global made at import, passed to `batches(loader)`),
    whose place then ends with that generator, and whose next iter() would start a new epoch. A wrapper's (accelerate's
    `DataLoaderShard`) iterator is its inner loader's."""
    for _ in range(8):
        inner = getattr(loader, "base_dataloader", None)
        if inner is None or inner is loader:
            break
        loader = inner
    iterator = getattr(loader, "_iterator", None)
    if iterator is None:
        return False
    kept = {id(value) for _, value in top_values(new_state)}
    return any(isinstance(value, GeneratorType) and id(value) not in kept and _reads(value, iterator)
               for _, value in top_values(old_state))


def _reads(generator: GeneratorType, iterator: Any) -> bool:
    """The generator (or one it delegates to, `yield from`) holds the iterator: `yield from loader` as the one it
    delegates to, `for batch in loader` on its frame's stack, which `gc.get_referents` sees (its locals do not)."""
    for _ in range(8):
        if generator.gi_yieldfrom is iterator or any(held is iterator for held in gc.get_referents(generator)):
            return True
        inner = generator.gi_yieldfrom
        if not isinstance(inner, GeneratorType):
            return False
        generator = inner
    return False
