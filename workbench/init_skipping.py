"""Run `setup()` without initializing parameters whose values are about to be replaced.

A resume fills the parameters from a snapshot and a rebuild carries the trained ones
over, so their random initialization is wasted work: seconds for a large model on a
CPU, a full pass over its memory on a GPU. Inside `skipping_init()`, the
`torch.nn.init` functions that fill a tensor in place (what every built-in module's
`reset_parameters` and most `_init_weights` use) do nothing to an `nn.Parameter`
and record the call instead. Afterwards `replay()` runs the recorded calls for the
parameters nothing filled, in their original order, so those are initialized as
usual; `replay_all()` makes the state exactly what a plain `setup()` would have
built (with other random draws), for a resume that loads nothing.

Only the calling thread's calls are recorded; other threads (another session in the
same process, a data thread) initialize as usual. Calls on plain tensors (data
made with `init.normal_(torch.empty(...))`) always run. A parameter filled through
`p.data.normal_()` or created with `torch.randn` is initialized anyway: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import init as torch_init

# The in-place initializers of torch.nn.init (each returns the tensor it filled).
_INITIALIZERS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
)
_lock = threading.Lock()
_recorders: dict[int, InitLog] = {}  # thread id -> the log its setup() records into
_originals: dict[str, Callable[..., Any]] = {}


@dataclass
class SkippedCall:
    """One initializer call not run. The parameter is held weakly: one setup() made and dropped (a tied
    head's first weight) is freed at once, and never initialized later."""

    function: Callable[..., Any]
    parameter: weakref.ref[torch.nn.Parameter]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def tensor(self) -> torch.nn.Parameter | None:
        return self.parameter()


@dataclass
class InitLog:
    """The initializations a `setup()` skipped, in call order."""

    calls: list[SkippedCall] = field(default_factory=list)

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """Each parameter whose initialization was skipped, once."""
        seen: dict[int, torch.nn.Parameter] = {}
        for call in self.calls:
            if (tensor := call.tensor) is not None:
                seen.setdefault(id(tensor), tensor)
        return list(seen.values())

    def replay(self, filled: Iterable[torch.Tensor]) -> list[torch.nn.Parameter]:
        """Initialize, as setup() would have, every skipped parameter not in `filled`; those parameters."""
        skip = {id(t) for t in filled}
        done: dict[int, torch.nn.Parameter] = {}
        with torch.no_grad():
            for call in self.calls:
                tensor = call.tensor
                if tensor is not None and id(tensor) not in skip:
                    call.function(tensor, *call.args, **call.kwargs)
                    done.setdefault(id(tensor), tensor)
        self.calls.clear()
        return list(done.values())

    def replay_all(self) -> list[torch.nn.Parameter]:
        return self.replay(())

    def forget(self) -> None:
        self.calls.clear()


def _skipping(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def initializer(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        log = _recorders.get(threading.get_ident())
        if log is None or not isinstance(tensor, torch.nn.Parameter):
            return original(tensor, *args, **kwargs)
        log.calls.append(SkippedCall(original, weakref.ref(tensor), args, kwargs))
        return tensor

    initializer.__vram_bench_skipping__ = True  # type: ignore[attr-defined]
    return initializer


def _install() -> None:
    for name in _INITIALIZERS:
        original = getattr(torch_init, name, None)
        if original is None or getattr(original, "__vram_bench_skipping__", False):
            continue
        _originals[name] = original
        setattr(torch_init, name, _skipping(name, original))


def _uninstall() -> None:
    for name, original in _originals.items():
        setattr(torch_init, name, original)
    _originals.clear()


@contextlib.contextmanager
def skipping_init(active: bool = True) -> Iterator[InitLog]:
    """Within: this thread's parameter initializations are recorded, not run (a no-op when not `active`)."""
    log = InitLog()
    if not active:
        yield log
        return
    me = threading.get_ident()
    with _lock:
        if not _recorders:
            _install()
        _recorders[me] = log
    try:
        yield log
    finally:
        with _lock:
            _recorders.pop(me, None)
            if not _recorders:
                _uninstall()
