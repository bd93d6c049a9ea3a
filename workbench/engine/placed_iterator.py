"""A loader given back its place makes its first iterator without drawing from the global random state.

Every DataLoader iterator draws a base seed from torch's global generator when it is made (`random_()` on an empty
int64). A run that never stopped drew it at the epoch's start; a resumed run gives the fresh loader its place
(torchdata's StatefulDataLoader keeps that seed in its state, and the new iterator takes it) and then makes the
iterator at the first resumed step, which draws once more: from there on, dropout and every other draw of the run
was one draw behind the run that never stopped (from the loader's own `generator=`, when it has one: the next
epoch's order was another). The first iterator made after the place was given is made with the
global state put back after it; later epochs draw their seeds as the uninterrupted run does.

A loader's own generator is set, once that iterator is made, to the state it had where the place was taken (kept
beside the place): torchdata's sampler draws this epoch's order again from the epoch's start, and the next epoch
draws from what that leaves in the generator. Put back to what the fresh loader's had instead, every resumed or
rebuilt run read, at its next epoch, the order of its first.
"""

from __future__ import annotations

from typing import Any

import torch


def make_first_iterator_without_drawing(loader: Any, own_generator_state: torch.Tensor | None = None) -> None:
    """For a loader holding a place its next iterator takes (StatefulDataLoader's `next_iter_state`): one shot. A
    wrapper's (accelerate's `DataLoaderShard`) is its inner loader's, which makes the iterators.
    `own_generator_state`: its `generator=`'s state where the place was taken (None: as it was before)."""
    for _ in range(8):  # a wrapper of a wrapper, not a proxy that makes a new object each time it is asked
        inner = getattr(loader, "base_dataloader", None)
        if inner is None or inner is loader or not hasattr(inner, "_get_iterator"):
            break
        loader = inner
    if getattr(loader, "next_iter_state", None) is None or "_get_iterator" in vars(loader):
        return
    make = loader._get_iterator

    def first_iterator() -> Any:
        del loader._get_iterator  # the class's again for every later epoch
        state = torch.get_rng_state()
        own = loader.generator  # a loader given a generator draws the seed from it (which may be kept and put back)
        own_state = own.get_state() if isinstance(own, torch.Generator) else None
        try:
            return make()
        finally:
            torch.set_rng_state(state)
            if own_state is not None:
                own.set_state(own_generator_state if own_generator_state is not None else own_state)

    loader._get_iterator = first_iterator
