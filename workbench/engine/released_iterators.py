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
