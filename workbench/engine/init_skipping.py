"""Run `setup()` without initializing parameters whose values are about to be replaced.

A resume fills the parameters from a snapshot and a rebuild carries the trained ones
over, so their random initialization is wasted work: seconds for a large model on a
CPU, a full pass over its memory on a GPU. Inside `skipping_init()`, the
`torch.nn.init` functions that fill a tensor in place (what every built-in module's
`reset_parameters` and most `_init_weights` use) *defer* their work on an
`nn.Parameter`: the call is recorded, not run.

A deferred initialization never changes what setup() computes. A torch function mode
watches the rest of setup() on this thread: the moment its code uses a deferred
parameter's values (a forward pass, `p.mul_(0.5)`, `p.data`, `copy.deepcopy(model)`,
`p.copy_` from it), that parameter's recorded calls run first, in their order, as a
plain setup() would have run them. A write that replaces the whole value
(`p.fill_(0.125)`, `p.copy_(pretrained)`, `p.data = pretrained`) makes the deferred
calls moot, and they are dropped. Moving a parameter (`model.to(device)`, `.half()`,
`to_empty`) keeps its initialization deferred: it runs later on wherever it went.

After setup(), `replay(filled)` runs what is still deferred for the parameters nothing
filled (so they are initialized as usual); `replay_all()` makes the state exactly what
a plain `setup()` would have built (with other random draws), for a resume that loads
nothing. Only the calling thread is affected; other threads initialize as usual. Calls
on plain tensors (data made with `init.normal_(torch.empty(...))`) always run.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import init as torch_init
from torch.overrides import TorchFunctionMode

# The in-place initializers of torch.nn.init (each returns the tensor it filled).
_INITIALIZERS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
)
# Uses of a parameter that read none of its values: they leave its initialization deferred.
_SHAPE_ONLY = frozenset({
    "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "requires_grad_", "size", "dim", "numel",
    "is_floating_point", "is_complex", "element_size", "stride", "storage_offset", "is_contiguous", "__hash__",
    "_has_compatible_shallow_copy_type", "empty_like", "_is_view", "get_device", "__len__",
})
# Moving ops whose result is the same parameter elsewhere (`param.data = moved` in Module._apply keeps it deferred).
_MOVES = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "empty_like"})
# Properties that hand out the values (every other property, `shape` or `grad`, reads none).
_VIEWS = frozenset({"data", "T", "mT", "H", "mH", "real", "imag"})
# In-place writes of the whole value: the deferred initialization would be overwritten, so it is dropped.
_OVERWRITES = frozenset({
    "copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "set_",
})
_lock = threading.Lock()
_recorders: dict[int, InitLog] = {}  # thread id -> the log its setup() records into
_originals: dict[str, Callable[..., Any]] = {}


@dataclass
class SkippedCall:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class _Deferred:
    """A parameter's deferred calls. Held weakly: one setup() made and dropped (a tied head's first
    weight) is freed at once, and never initialized."""

    parameter: weakref.ref[torch.nn.Parameter]
    calls: list[SkippedCall] = field(default_factory=list)


@dataclass
class InitLog:
    """The initializations a `setup()` deferred, per parameter, in the order they were first deferred."""

    deferred: dict[int, _Deferred] = field(default_factory=dict)  # id(parameter) -> its calls
    moved: dict[int, int] = field(default_factory=dict, repr=False)  # id(a moved copy) -> id(its parameter)

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """Each parameter whose initialization is still deferred."""
        return [p for entry in self.deferred.values() if (p := entry.parameter()) is not None]

    def defer(self, function: Callable[..., Any], parameter: torch.nn.Parameter, args: tuple, kwargs: dict) -> None:
        entry = self.deferred.get(id(parameter))
        if entry is None or entry.parameter() is not parameter:  # an id reused by a new object
            entry = self.deferred[id(parameter)] = _Deferred(weakref.ref(parameter))
        entry.calls.append(SkippedCall(function, args, kwargs))

    def run(self, parameter: torch.Tensor) -> bool:
        """Run a parameter's deferred calls now (setup() is about to use its values); True if it had any."""
        entry = self.deferred.pop(id(parameter), None)
        if entry is None or entry.parameter() is not parameter:
            return False
        with torch.no_grad():
            for call in entry.calls:
                call.function(parameter, *call.args, **call.kwargs)
        return True

    def drop(self, parameter: torch.Tensor) -> None:
        """setup() replaced the whole value: the deferred calls would have been overwritten."""
        self.deferred.pop(id(parameter), None)

    def replay(self, filled: Iterable[torch.Tensor]) -> list[torch.nn.Parameter]:
        """Initialize, as setup() would have, every deferred parameter not in `filled`; those parameters."""
        skip = {id(t) for t in filled}
        done = []
        for key in list(self.deferred):
            parameter = self.deferred[key].parameter()
            if parameter is not None and key not in skip and self.run(parameter):
                done.append(parameter)
        self.forget()
        return done

    def replay_all(self) -> list[torch.nn.Parameter]:
        return self.replay(())

    def forget(self) -> None:
        self.deferred.clear()
        self.moved.clear()


class _RunWhenUsed(TorchFunctionMode):
    """Runs a deferred parameter's initialization just before setup() uses its values (see the module doc)."""

    def __init__(self, log: InitLog) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        log = self.log
        name, access = _name_of(func)
        moved_from: torch.Tensor | None = None
        if log.deferred:
            for position, value in enumerate(_tensors_in(args, kwargs)):
                if id(value) not in log.deferred:
                    continue
                if name in _SHAPE_ONLY or (access is not None and name not in _VIEWS):
                    if name in _MOVES and position == 0:
                        moved_from = value
                elif name == "data" and access == "__set__" and position == 0:
                    source = args[1] if len(args) > 1 else None
                    if log.moved.get(id(source)) != id(value):
                        log.drop(value)  # `p.data = pretrained`: the deferred value is replaced
                elif name in _OVERWRITES and position == 0:
                    log.drop(value)
                else:
                    log.run(value)
        result = func(*args, **kwargs)
        if moved_from is not None and isinstance(result, torch.Tensor):
            log.moved[id(result)] = id(moved_from)
        return result


def _name_of(func: Any) -> tuple[str | None, str | None]:
    """(`data`, `__get__`) for a property access, (`copy_`, None) for a method or function."""
    owner = getattr(func, "__self__", None)
    if isinstance(owner, types.GetSetDescriptorType):
        return owner.__name__, getattr(func, "__name__", None)
    return getattr(func, "__name__", None), None


def _tensors_in(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors among the arguments, one level into lists and tuples (`torch.cat([a, b])`)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _deferring(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def initializer(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        log = _recorders.get(threading.get_ident())
        if log is None or not isinstance(tensor, torch.nn.Parameter):
            return original(tensor, *args, **kwargs)
        log.defer(original, tensor, args, kwargs)
        return tensor

    initializer.__vram_bench_skipping__ = True  # type: ignore[attr-defined]
    return initializer


def _install() -> None:
    for name in _INITIALIZERS:
        original = getattr(torch_init, name, None)
        if original is None or getattr(original, "__vram_bench_skipping__", False):
            continue
        _originals[name] = original
        setattr(torch_init, name, _deferring(original))


def _uninstall() -> None:
    for name, original in _originals.items():
        setattr(torch_init, name, original)
    _originals.clear()


@contextlib.contextmanager
def skipping_init(active: bool = True) -> Iterator[InitLog]:
    """Within: this thread's parameter initializations are deferred (a no-op when not `active`)."""
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
        with _RunWhenUsed(log):  # torch function modes are per thread: other threads are not watched
            yield log
    finally:
        with _lock:
            _recorders.pop(me, None)
            if not _recorders:
                _uninstall()
