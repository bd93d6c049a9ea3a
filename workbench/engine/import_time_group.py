"""Under torchrun the default process group exists while the project is imported.

A script-style trainer uses it at module level: a `DistributedSampler(dataset)` (which asks for the world size),
a device mesh (`init_device_mesh`, pytorch/examples' tensor-parallel example, which otherwise made a group of its
own with backend "undefined" that vram-bench could not make again after a failed collective), `dist.get_rank()`.
vram-bench made the group only after the import, so that a script making its own at import kept it; a DCGAN port
with `DistributedSampler(dataset) if dist.is_initialized() else None` at import then trained each rank on the whole
dataset, silently. Now the group is made before the import, and a call of the project's own to
`init_process_group` during the import is skipped (the group it asks for exists) and said, with where it was made.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed import distributed_c10d

if TYPE_CHECKING:
    from workbench.engine.distributed import ProcessGroups


_running_statements_again = [0]  # > 0 while x or a rebuild runs the project's module statements again


@contextlib.contextmanager
def default_group_at_import(groups: ProcessGroups | None) -> Iterator[None]:
    """Around the project's import: the default group made first; `init_process_group` skipped while it exists."""
    if groups is None:
        yield
        return
    groups.make_default()
    original = dist.init_process_group
    importing = True

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not ((importing or _running_statements_again[0]) and dist.is_initialized()):
            return original(*args, **kwargs)  # after the import: torch's own answer (setup_error_hint explains it)
        if importing:
            groups.skipped_inits.append(_skipped_note(args, kwargs, dist.get_backend()))
        return None

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    distributed_c10d.init_process_group = init_process_group  # type: ignore[assignment]
    try:
        yield
    finally:
        importing = False  # a name the script imported keeps the wrapper: it calls torch's own from now on
        dist.init_process_group = original
        distributed_c10d.init_process_group = original


@contextlib.contextmanager
def inits_skipped_again() -> Iterator[None]:
    """While x or a rebuild runs module statements again (llm.c's `if ddp: init_process_group(...)`, when a value
    the block reads changed): the call the import skipped (and said) is skipped again, through the name the script
    imported or `dist.init_process_group`, rather than failing the whole run on "trying to initialize the default
    process group twice"."""
    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        return None

    _running_statements_again[0] += 1
    dist.init_process_group = init_process_group  # type: ignore[assignment]
    distributed_c10d.init_process_group = init_process_group  # type: ignore[assignment]
    try:
        yield
    finally:
        _running_statements_again[0] -= 1
        dist.init_process_group = original
        distributed_c10d.init_process_group = original


def _skipped_note(args: tuple[Any, ...], kwargs: dict[str, Any], backend: str) -> str:
    caller = sys._getframe(2)  # the project's line that called init_process_group
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    asked = kwargs.get("backend", args[0] if args else None)
    wanted = f"backend {asked!r}" if asked else "the default backend"
    ignored = sorted(k for k in kwargs if k != "backend") + (["its other arguments"] if len(args) > 1 else [])
    rest = f"; {', '.join(ignored)} not used (--collective-timeout sets the timeout)" if ignored else ""
    return (f"{where} called init_process_group ({wanted}): skipped, as vram-bench made the default process group "
            f"({backend}) before importing the project, so that what the script builds at import from it (a "
            f"DistributedSampler, a device mesh) works{rest}")
