"""What a DistributedDataParallel error means for the user: which parameters, and how to go on.

A swapped `forward` that stops using a parameter makes DDP's next step raise "Expected to have
finished reduction in the prior iteration ... Parameter indices which did not receive grad for
rank 0: 2 3" on every rank. The indices are positions in the wrapped module's trainable
parameters; the user wants their names. After this error the wrapper's reducer refuses every
later step, even with the old `forward` back: only a new wrapper (a rebuild) trains again.
"""

from __future__ import annotations

import re
from typing import Any

from torch.nn.parallel import DistributedDataParallel


UNUSED_MARKER = "Expected to have finished reduction in the prior iteration"
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+:\s*([\d ]+)")


def is_unused_parameter_error(message: str) -> bool:
    return UNUSED_MARKER in message


def unused_parameter_names(message: str, state: Any, namespaces: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The names DDP's indices stand for, in the first DDP wrapper of the state (empty when unknown)."""
    match = _INDICES.search(message)
    if match is None:
        return []
    indices = [int(i) for i in match.group(1).split()]
    for ddp in _wrappers(state, namespaces):
        trainable = [name for name, p in ddp.module.named_parameters() if p.requires_grad]
        if all(i < len(trainable) for i in indices):
            return [trainable[i] for i in indices]
    return []


def unused_parameter_sentence(message: str, state: Any, namespaces: list[tuple[str, dict[str, Any]]],
                              changed_since: tuple[int, int, int] | None = None) -> str:
    """`changed_since`: (the prior step, the code version that ran it, the version now) when the code changed after
    that step (a rollback or a fix saved before the next step showed the error): the code now running is then not
    the one to blame, and a rollback is no remedy; the rebuild is."""
    names = unused_parameter_names(message, state, namespaces)
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") if names else "some parameters"
    gradients = "its gradient was" if len(names) == 1 else "their gradients were"
    if changed_since is not None:
        step, then, now = changed_since
        return (
            f"DistributedDataParallel: the code that ran step {step} (code version {then}) did not use {shown} in the "
            f"loss, so {gradients} never reduced and the replicas may differ by that step. The code changed since "
            f"(version {now} runs now), but DDP's reducer refuses every step after this error, so every rank paused: "
            "resume (command `resume`) rebuilds every rank's DDP wrapper (setup() runs again, weights carried over, "
            "rank 0's copied to all) and trains on with the code now running"
        )
    return (
        f"DistributedDataParallel: the code now running no longer uses {shown} in the loss, so {gradients} "
        "never reduced and the replicas may differ by the last step. Every rank paused. Roll back (command `rollback`) "
        "or save a fix, and every rank rebuilds its DDP wrapper (setup() runs again, weights carried over, rank 0's "
        "copied to all); or pass find_unused_parameters=True to DistributedDataParallel in setup() and rebuild (R)"
    )


def _wrappers(state: Any, namespaces: list[tuple[str, dict[str, Any]]]) -> list[DistributedDataParallel]:
    """The DDP wrappers in the state's containers and the project's module globals."""
    found: list[DistributedDataParallel] = []
    stack: list[Any] = [state, *(namespace for _, namespace in namespaces)]
    visited: set[int] = set()
    while stack:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, DistributedDataParallel):
            found.append(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return found
