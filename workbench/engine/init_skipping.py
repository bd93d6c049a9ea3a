"""Run `setup()` without initializing parameters whose values are about to be replaced.

A resume fills the parameters from a snapshot and a rebuild carries the trained ones
over, so their random initialization is wasted work: seconds for a large model on a
CPU, a full pass over its memory on a GPU. Inside `skipping_init()`, the
`torch.nn.init` functions that fill a tensor in place (what every built-in module's
`reset_parameters` and most `_init_weights` use) *defer* their work on an
`nn.Parameter`: the call is recorded, not run.

A deferred initialization never changes what setup() computes, nor what it draws. A
skipped `kaiming_uniform_` draws nothing, so without care every draw setup() makes after
building its model (synthetic data, a `random_split`, a sampler's seed) would come from
another place in torch's stream than a plain setup()'s, and a resumed run would train on
another split than the run it resumes. So each deferred call is also an *owed* call, kept
in setup()'s order. A torch function mode watches the rest of setup() on this thread, and
the moment its code uses a deferred parameter's values (a forward pass, `p.mul_(other)`,
`p.data.sum()`, `copy.deepcopy(model)`) or draws from a generator the owed calls draw from (a
random torch function, `torch.manual_seed`, `torch.get_rng_state`), every owed call runs
first, in that order: on its parameter when the parameter is still where and what it
was made (it is then initialized), or else on a scratch tensor of the shape, dtype and
device it was made with (the draws of a parameter setup() dropped or freed; the values of
one it moved or converted, rounded through the same dtypes and copied in). Then what
setup() reads or draws is a plain setup()'s, at the cost of the initialization a resume
meant to skip; `settled` says what set it off.

A write that replaces the whole value (`p.fill_(0.125)`, `p.copy_(pretrained)`,
`p.data = pretrained`) drops the deferred values, whose draws stay owed. A random fill of
a whole parameter (`p.uniform_()`, as `nn.MultiheadAttention` does) is initialization,
deferred as torch.nn.init's is. So is arithmetic in place with plain numbers on a parameter
still owed its initialization (timm's `trunc_normal_`: `uniform_`, then `erfinv_`, `mul_`,
`add_`, `clamp_`), and a library's own initializer that torch.nn.init dispatches to while
the library builds a model (transformers' `guard_torch_init_functions`). `p.data` is an alias
of all of `p`: a fill or arithmetic through it (transformers 4's `module.weight.data.normal_(...)`)
is deferred as on `p`, `p.data.copy_(pretrained)` replaces the value, and a read through it is
a use. Moving a parameter (`model.to(device)`, `.half()`, `to_empty`) keeps its
initialization deferred. A write through an indexed view
(`Embedding`'s `weight[padding_idx].fill_(0)`) is deferred after the parameter's own
calls; a read through one is a use. A draw the mode cannot see (a
`Generator`'s own `manual_seed`, another thread's draw, a C++ kernel's) is found at the
next settling or at the end, by the generator's state, and `unseen_draw` says so; a
reseed to the very state the model was built from cannot be told apart.

After setup(), `replay(filled)` runs what is still deferred for the parameters nothing
filled (so they are initialized as usual); `replay_all()` runs every owed call in
setup()'s order, which makes the state exactly what a plain `setup()` would have built,
for a resume that loads nothing. Only the calling thread is affected; other threads
initialize as usual. Calls on plain tensors (data made with `init.normal_(torch.empty(...))`)
always run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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
    "_has_compatible_shallow_copy_type", "empty_like", "_is_view", "get_device", "__len__", "data_ptr",
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
# In-place random fills of the whole value: on a parameter they are initialization (nn.MultiheadAttention's
# `xavier_uniform_`, bound at import, fills `in_proj_weight` with `Tensor.uniform_`), deferred like torch.nn.init's.
_RANDOM_FILLS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_",
                           "log_normal_", "cauchy_"})
# In-place arithmetic an initializer of a library's own applies to a parameter it just filled at random (timm's and
# DeiT's `trunc_normal_`: `uniform_`, then `erfinv_`, `mul_`, `add_`, `clamp_`). With plain numbers for arguments it
# reads nothing but the parameter's own values, so it is deferred after the parameter's calls, as part of them.
_SCALAR_IN_PLACE = frozenset({"erfinv_", "mul_", "add_", "sub_", "div_", "clamp_", "clamp_min_", "clamp_max_", "neg_",
                              "abs_", "sqrt_", "exp_", "tanh_", "fmod_", "remainder_"})
# Initializers that fill without drawing: what they owe is an order, not a draw.
_DRAWLESS = frozenset({"constant_", "ones_", "zeros_", "eye_", "dirac_", "_write_through_view"}) | _SCALAR_IN_PLACE
# Writes that replace a whole view's values and read none: `weight[padding_idx].fill_(0)` (nn.Embedding's).
_VIEW_WRITES = frozenset({"fill_", "zero_"})
# Torch functions that draw from a generator (the default one of their device unless given `generator=`).
# Composites are named too: inside a mode's handler the calls they make are not seen.
_DRAWS = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal", "poisson",
    "bernoulli", "multinomial", "binomial", "_standard_gamma", "_sample_dirichlet", "dropout", "dropout1d",
    "dropout2d", "dropout3d", "alpha_dropout", "feature_dropout", "feature_alpha_dropout", "native_dropout", "rrelu",
    "rrelu_", "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d", "normal_", "uniform_", "random_",
    "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
    # torch.nn.init's on plain tensors (on parameters they defer), seen whole: they draw inside the mode's handler
    "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
    "sparse_",
})
# Functions of torch's own random module (and torch.cuda's) that set or read a generator's state: a reseed after
# the model must come after the draws the model's initialization makes, and a state read must include them. Each
# with the generators it touches: "any" (torch.manual_seed seeds every device), "cpu" or "cuda".
_CUDA_SEEDING = {name: "cuda" for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "get_rng_state",
                                          "get_rng_state_all", "set_rng_state", "set_rng_state_all")}
_SEEDING = {
    "torch": {"manual_seed": "any", "seed": "any", "get_rng_state": "cpu", "set_rng_state": "cpu"},
    "torch.random": {"manual_seed": "any", "seed": "any", "get_rng_state": "cpu", "set_rng_state": "cpu"},
    "torch.cuda": _CUDA_SEEDING,
    "torch.cuda.random": _CUDA_SEEDING,
}
SAID_USE_SECONDS = 1.0  # a use of a deferred value that made the owed calls run is named in the notes from this long
_lock = threading.Lock()
_recorders: dict[int, InitLog] = {}  # thread id -> the log its setup() records into
_originals: dict[str, Callable[..., Any]] = {}
_seeding_originals: dict[tuple[str, str], Callable[..., Any]] = {}


@dataclass
class SkippedCall:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Settled:
    """One time the owed calls ran during setup(): what set it off, where in the project, and what it cost."""

    reason: str
    where: str | None
    calls: int
    seconds: float
    drew: bool  # a draw or a seed set it off (else a use of a deferred value)


def _reference(parameter: torch.nn.Parameter) -> Callable[[], torch.nn.Parameter | None]:
    """A weak reference, so a parameter setup() made and dropped (a tied head's first weight) is freed at once; a
    strong one when modules convert by swapping tensors (`torch.__future__.set_swap_module_params_on_conversion`),
    since `torch.utils.swap_tensors` refuses a tensor anything refers to weakly: `.to()` raised in setup()."""
    if torch.__future__.get_swap_module_params_on_conversion():
        return lambda: parameter
    return weakref.ref(parameter)


@dataclass
class _Deferred:
    """A parameter's deferred calls, its parameter held weakly (`_reference`)."""

    parameter: Callable[[], torch.nn.Parameter | None]
    calls: list[SkippedCall] = field(default_factory=list)
    # (calls made before it, dtype): each conversion of the parameter (`.half()`, `.float()`) since it was made, so
    # values made on a scratch tensor are rounded as the plain setup()'s were on their way through the dtypes
    conversions: list[tuple[int, torch.dtype]] = field(default_factory=list)


@dataclass
class _Owed:
    """A deferred call in setup()'s order, with what it was made on: its draws are owed even if its parameter goes."""

    call: SkippedCall
    entry: _Deferred  # its parameter's entry (ids are reused: a freed parameter's may be a new one's)
    index: int  # its place among the entry's calls
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @property
    def draws(self) -> bool:
        return getattr(self.call.function, "__name__", "") not in _DRAWLESS


@dataclass
class InitLog:
    """The initializations a `setup()` deferred, per parameter, in the order they were first deferred."""

    deferred: dict[int, _Deferred] = field(default_factory=dict)  # id(parameter) -> its calls
    moved: dict[int, int] = field(default_factory=dict, repr=False)  # id(a moved copy) -> id(its parameter)
    # id(an indexed view of a deferred parameter) -> (the view, weakly; its parameter; the index)
    views: dict[int, tuple[weakref.ref, torch.nn.Parameter, Any]] = field(default_factory=dict, repr=False)
    owed: list[_Owed] = field(default_factory=list, repr=False)  # every call not run yet, in setup()'s order
    settled: list[Settled] = field(default_factory=list)  # each time setup()'s own use made the owed calls run
    unseen_draw: bool = False  # a generator the owed calls draw from changed where the mode could not see it
    # each generator the owed calls draw from, with its state when it was first owed (a later change is unseen)
    _states_when_owed: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list, repr=False)

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """Each parameter whose initialization is still deferred."""
        return [p for entry in self.deferred.values() if (p := entry.parameter()) is not None]

    def defer(self, function: Callable[..., Any], parameter: torch.nn.Parameter, args: tuple, kwargs: dict) -> None:
        entry = self.deferred.get(id(parameter))
        if entry is None or entry.parameter() is not parameter:  # an id reused by a new object
            entry = self.deferred[id(parameter)] = _Deferred(_reference(parameter))
        call = SkippedCall(function, args, kwargs)
        entry.calls.append(call)
        owed = _Owed(call, entry, len(entry.calls) - 1, parameter.shape, parameter.dtype, parameter.device)
        self.owed.append(owed)
        if owed.draws:
            generator = _generator_of(function, args, kwargs) or _default_generator(parameter.device)
            if generator is not None and all(g is not generator for g in self._owed_generators):
                self._states_when_owed.append((generator, generator.get_state()))

    @property
    def _owed_generators(self) -> list[torch.Generator]:
        return [generator for generator, _ in self._states_when_owed]

    def owes_draws_from(self, generator: torch.Generator | None, device: torch.device | None) -> bool:
        """Whether a draw from `generator` (None: the default one of `device`) must wait for the owed calls."""
        if not self._owed_generators:
            return False
        wanted = generator if generator is not None else _default_generator(device or torch.get_default_device())
        return any(g is wanted for g in self._owed_generators)

    def owes_draws_on(self, scope: str) -> bool:
        """Whether seeding or reading the generators of `scope` ("any", "cpu", "cuda") must wait for the owed calls."""
        return any(scope == "any" or g.device.type == scope for g in self._owed_generators)

    def converted(self, parameter: torch.Tensor, dtype: torch.dtype) -> None:
        """A deferred parameter was converted (`.half()`): its values, made later, are rounded through `dtype` too."""
        entry = self.deferred.get(id(parameter))
        if entry is not None and entry.parameter() is parameter:
            entry.conversions.append((len(entry.calls), dtype))

    def settle(self, reason: str, said: bool = True, drew: bool = True) -> None:
        """Run every owed call now, in setup()'s order, so the generators stand where a plain setup()'s would.

        A call runs on its parameter when that is still deferred and still of the shape, dtype and device it was
        made with (the parameter is then initialized and no longer deferred); otherwise on a scratch tensor made
        like it, which is copied into the parameter once its last call ran (a parameter moved since) or dropped
        (a parameter setup() overwrote or freed: only its draws were owed)."""
        if said:
            self.check_unseen_draws()  # before the owed draws move the states on
        owed, self.owed = self.owed, []
        self._states_when_owed = []
        if not owed:
            return
        started = time.perf_counter()
        left: dict[int, int] = {}  # id(entry) -> its calls not run yet
        for item in owed:
            left[id(item.entry)] = left.get(id(item.entry), 0) + 1
        scratch: dict[int, torch.Tensor] = {}
        done: list[_Deferred] = []
        # No mode sees these calls (from `torch.manual_seed`'s wrapper the mode is still on): each runs, not defers.
        with torch.no_grad(), torch._C.DisableTorchFunction():
            for item in owed:
                key = id(item.entry)
                parameter = item.entry.parameter()
                live = parameter is not None and self.deferred.get(id(parameter)) is item.entry
                here = (live and not item.entry.conversions and parameter.shape == item.shape
                        and parameter.dtype == item.dtype and parameter.device == item.device and key not in scratch)
                if here:
                    target = parameter
                elif key in scratch:  # rounded through what the parameter went through since the last call
                    target = scratch[key] = _converted(scratch[key], item.entry, item.index - 1, item.index)
                else:
                    target = scratch[key] = torch.empty(item.shape, dtype=item.dtype, device=item.device)
                item.call.function(target, *item.call.args, **item.call.kwargs)
                left[key] -= 1
                if left[key]:
                    continue
                made = scratch.pop(key, None)
                if not live:
                    continue
                if made is None:
                    done.append(item.entry)
                elif made.shape == parameter.shape and parameter.device.type != "meta":
                    # converted and moved as the plain setup()'s `.half()` and `.to()` did
                    parameter.copy_(_converted(made, item.entry, item.index, len(item.entry.calls)))
                    done.append(item.entry)
        ran = {id(item.call) for item in owed}
        for entry in done:
            parameter = entry.parameter()
            if parameter is not None and all(id(call) in ran for call in entry.calls):
                del self.deferred[id(parameter)]
        if said:
            self.settled.append(Settled(reason, _project_frame(), len(owed), time.perf_counter() - started, drew))

    def make_kept_views(self) -> None:
        """At the end of setup(): an indexed view setup() kept (`self.pad = emb.weight[0]`) may be read after it, when
        nothing watches: its parameter's values are made now, as for a use."""
        for ref, parameter, _ in list(self.views.values()):
            if ref() is not None and id(parameter) in self.deferred:
                self.use(parameter, "an indexed view kept")
        self.views.clear()

    def check_unseen_draws(self) -> None:
        """At the end of setup(): a generator that owed calls draw from, changed while they were owed, was drawn
        from or seeded where the torch function mode does not look; what setup() drew after that may differ."""
        if any(not torch.equal(g.get_state(), state) for g, state in self._states_when_owed):
            self.unseen_draw = True

    def is_deferred(self, parameter: torch.Tensor) -> bool:
        entry = self.deferred.get(id(parameter))
        return entry is not None and entry.parameter() is parameter

    def use(self, parameter: torch.Tensor, reason: str) -> None:
        """setup() is about to use a deferred parameter's values: every owed call runs first, in setup()'s order."""
        entry = self.deferred.get(id(parameter))
        if entry is None or entry.parameter() is not parameter:
            return
        self.settle(reason, drew=False)
        self.run(parameter)  # a parameter the settling could not fill in place (a shape changed since): its own calls

    def run(self, parameter: torch.Tensor) -> bool:
        """Run a parameter's deferred calls now, on it; True if it had any."""
        entry = self.deferred.pop(id(parameter), None)
        if entry is None or entry.parameter() is not parameter:
            return False
        with torch.no_grad(), torch._C.DisableTorchFunction():  # run, not deferred again, wherever it is called from
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
        """Initialize everything deferred, every owed call in setup()'s order: a plain setup()'s values and draws."""
        parameters = self.parameters
        self.settle("replay", said=False)
        self.replay(())
        return parameters

    def forget(self) -> None:
        self.deferred.clear()
        self.moved.clear()
        self.views.clear()
        self.owed.clear()
        self._states_when_owed = []


def settled_notes(log: InitLog, action: str) -> list[str]:
    """What a resume's or rebuild's notes say of the initialization setup() made run after all (see the module doc).

    A draw or a seed is always said, with what would keep the work skipped. A use of the values (an EMA's copy of
    the weights) is usual and needs the values anyway (it also runs what was built before them, in order), so it is
    said only when it took SAID_USE_SECONDS or more."""
    notes = []
    seconds = sum(s.seconds for s in log.settled)
    calls = sum(s.calls for s in log.settled)
    cost = f"{calls} call{'s' if calls != 1 else ''}, {seconds:.2f} s"
    drew = next((s for s in log.settled if s.drew), None)
    if drew is not None:
        at = f"{drew.reason} at {drew.where}" if drew.where else drew.reason
        seeds = drew.reason.endswith(("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
                                      "set_rng_state_all"))
        advice = ("seed before building the model" if seeds
                  else "make those draws before the model, or from a torch.Generator of their own")
        notes.append(f"setup() uses torch's random generator after building its model ({at}): the initialization a "
                     f"{action} skips ran first ({cost}), so what it draws is a fresh start's; {advice}, and a "
                     f"{action} skips that work")
    elif log.settled and seconds >= SAID_USE_SECONDS:
        first = log.settled[0]
        at = f"{first.reason} at {first.where}" if first.where else first.reason
        notes.append(f"setup() reads the values of parameters it built ({at}): their initialization, and that of "
                     f"everything built before them, ran first ({cost}), in a fresh start's order")
    if log.unseen_draw:
        notes.append("setup() drew from or seeded a random generator after building its model where vram-bench does "
                     "not look (a Generator's own method, another thread, or code outside torch's Python functions): "
                     "what it drew after that may differ from a fresh start's, since the initialization a "
                     f"{action} skips draws nothing")
    return notes


class _RunWhenUsed(TorchFunctionMode):
    """Runs a deferred parameter's initialization just before setup() uses its values (see the module doc)."""

    def __init__(self, log: InitLog) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        log = self.log
        if _recorders.get(threading.get_ident()) is not log:  # a process forked from setup() (a loader's worker)
            return func(*args, **kwargs)
        name, access = _name_of(func)
        moved_from: torch.Tensor | None = None
        if getattr(func, "__vram_bench_skipping__", False):  # torch.nn.init's, bound at import (MultiheadAttention)
            if isinstance(args[0] if args else kwargs.get("tensor"), torch.nn.Parameter):
                return func(*args, **kwargs)  # deferred by the initializer, like a call through torch.nn.init
        elif (name in _RANDOM_FILLS and access is None and args and isinstance(args[0], torch.nn.Parameter)
              and _deferrable(args[0])):
            log.defer(func, args[0], args[1:], kwargs)  # a layer filling its own parameter: initialization
            return args[0]
        elif (name in _SCALAR_IN_PLACE and access is None and args and isinstance(args[0], torch.nn.Parameter)
              and log.is_deferred(args[0]) and _deferrable(args[0]) and args[0].is_floating_point()
              and next(_tensors_in(args[1:], kwargs), None) is None):
            log.defer(func, args[0], args[1:], kwargs)  # `p.uniform_(...)` then `p.erfinv_()`: still initialization
            return args[0]
        elif (name in _INITIALIZERS and access is None and not args
              and isinstance(kwargs.get("tensor"), torch.nn.Parameter)
              and _deferrable(kwargs["tensor"], through_data=True)):  # initializers write under no_grad
            # torch.nn.init's dispatch to a library's own initializer put in its place while the library builds
            # a model (transformers' `guard_torch_init_functions`): initialization, deferred as torch.nn.init's is
            rest = {key: value for key, value in kwargs.items() if key != "tensor"}
            log.defer(func, kwargs["tensor"], (), rest)
            return kwargs["tensor"]
        elif (access is None and args and log.views and (whole := _whole_alias(log, args[0])) is not None
              and _deferrable(whole, through_data=True)
              and (name in _RANDOM_FILLS or name in _VIEW_WRITES
                   or (name in _SCALAR_IN_PLACE and whole.is_floating_point()
                       and next(_tensors_in(args[1:], kwargs), None) is None))):
            # `p.data.normal_(mean=0.0, std=0.02)`, `p.data.zero_()`: transformers 4's `_init_weights` and the code
            # modelled on it; `p.data` is all of `p`, so the call is deferred as on `p`, after its own
            log.defer(func, whole, args[1:], kwargs)
            return args[0]
        elif (name == "copy_" and access is None and args and log.views
              and (whole := _whole_alias(log, args[0])) is not None
              and not any(id(t) in log.deferred or id(t) in log.views for t in _tensors_in(args[1:], kwargs))):
            log.drop(whole)  # `p.data.copy_(pretrained)`: the deferred value is replaced, as by `p.copy_(pretrained)`
        if log.owed and _draws(name, access, args, kwargs) and log.owes_draws_from(
            kwargs.get("generator"), _device_of(args, kwargs)
        ):
            log.settle(_shown(func, name))
        if log.views and (viewed := _viewed(log, args, kwargs)) is not None:
            view, parameter, index = viewed
            if name in _VIEW_WRITES and access is None and args and args[0] is view and id(parameter) in log.deferred:
                log.defer(_write_through_view, parameter, (index, name, args[1:]), kwargs)  # after its init, in order
                return view
            if (index is Ellipsis and name == "__getitem__" and access is None and args[0] is view
                    and log.is_deferred(parameter)):
                part = func(*args, **kwargs)  # `p.data[padding_idx]`: a view of the parameter, as `p[padding_idx]`
                if isinstance(part, torch.Tensor) and part._base is view:
                    log.views[id(part)] = (weakref.ref(part), parameter, args[1] if len(args) > 1 else None)
                    return part
                log.use(parameter, _shown(func, name))  # advanced indexing's copy: the values are read
                return func(*args, **kwargs)
            if not (index is Ellipsis and (name in _SHAPE_ONLY or (access is not None and name not in _VIEWS))):
                log.use(parameter, _shown(func, name))  # the view's values are read: its parameter's are made first
        if (name == "__getitem__" and access is None and log.deferred and args
                and isinstance(args[0], torch.nn.Parameter) and id(args[0]) in log.deferred):
            view = func(*args, **kwargs)
            if isinstance(view, torch.Tensor) and view._base is args[0]:  # a view (not advanced indexing's copy) of
                # values not made yet: they are made when it is read, and a write to it is deferred after them
                log.views[id(view)] = (weakref.ref(view), args[0], args[1] if len(args) > 1 else None)
                return view
            log.use(args[0], _shown(func, name))  # a copy of the values: made first, and the copy taken again
            return func(*args, **kwargs)
        alias_of: torch.Tensor | None = None
        if log.deferred:
            for position, value in enumerate(_tensors_in(args, kwargs)):
                if id(value) not in log.deferred:
                    continue
                if name in _SHAPE_ONLY or (access is not None and name not in _VIEWS):
                    if name in _MOVES and position == 0:
                        moved_from = value
                elif name == "data" and access == "__get__" and position == 0 and log.is_deferred(value):
                    alias_of = value  # `p.data`: its values are read when the alias is, not now
                elif name == "data" and access == "__set__" and position == 0:
                    source = args[1] if len(args) > 1 else None
                    if log.moved.get(id(source)) != id(value):
                        log.drop(value)  # `p.data = pretrained`: the deferred value is replaced
                elif name == "data" and access == "__set__" and args and value is args[0]:
                    pass  # `p.data = p`: Module._apply after a move to where p already is (`.to(bench.device)`)
                elif name in _OVERWRITES and position == 0:
                    log.drop(value)
                else:
                    log.use(value, _shown(func, name))
        result = func(*args, **kwargs)
        if alias_of is not None and isinstance(result, torch.Tensor):
            log.views[id(result)] = (weakref.ref(result), alias_of, Ellipsis)  # all of it: `[...]`
        if moved_from is not None and isinstance(result, torch.Tensor):
            log.moved[id(result)] = id(moved_from)
            if result.dtype != moved_from.dtype:
                log.converted(moved_from, result.dtype)
        return result


def _shown(func: Any, name: str | None) -> str:
    """`torch.randperm`, `Tensor.normal_`, `F.dropout`: how a note names what set the owed calls off."""
    owner = getattr(func, "__self__", None)
    qualname = getattr(func, "__qualname__", "") or ""
    if (isinstance(owner, types.GetSetDescriptorType) or getattr(func, "__objclass__", None) is not None
            or qualname.startswith(("Tensor.", "TensorBase.", "_TensorBase."))):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", "") or ""
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if module == "torch.nn.init":
        return f"nn.init.{name}"
    return f"torch.{name}"


def _viewed(log: InitLog, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.nn.Parameter, Any] | None:
    """The first argument that is an indexed view of a deferred parameter: (the view, its parameter, the index)."""
    for value in _tensors_in(args, kwargs):
        found = log.views.get(id(value))
        if found is not None and found[0]() is value:
            return value, found[1], found[2]
    return None


def _deferrable(parameter: torch.Tensor, through_data: bool = False) -> bool:
    """Whether a write to the parameter can wait: not if, done now, it would raise (a leaf that requires grad,
    written in place outside `torch.no_grad()`, not through `.data`), or if another tensor could see it (the
    parameter shares its storage: a slice of a flat buffer)."""
    if not through_data and torch.is_grad_enabled() and parameter.requires_grad:
        return False
    try:
        storage = parameter.untyped_storage()
        return parameter.storage_offset() == 0 and storage.nbytes() == parameter.numel() * parameter.element_size()
    except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own to ask
        return False


def _whole_alias(log: InitLog, tensor: Any) -> torch.nn.Parameter | None:
    """The still deferred parameter whose `.data` this tensor is, if it is one."""
    found = log.views.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
    if found is None or found[0]() is not tensor or found[2] is not Ellipsis or not log.is_deferred(found[1]):
        return None
    return found[1]


def _write_through_view(tensor: torch.Tensor, index: Any, name: str, args: tuple, **kwargs: Any) -> torch.Tensor:
    """A deferred `tensor[index].fill_(0)`: run after the parameter's initialization, as setup() ran it."""
    getattr(tensor[index], name)(*args, **kwargs)
    return tensor


def _draws(name: str | None, access: str | None, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws at random (attention draws only with a dropout)."""
    if name == "scaled_dot_product_attention":
        dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        return bool(dropout)
    return name in _DRAWS and access is None


def _converted(made: torch.Tensor, entry: _Deferred, after: int, upto: int) -> torch.Tensor:
    """`made` rounded through the conversions of `entry`'s parameter made after its call `after` and up to `upto`."""
    for calls_before, dtype in entry.conversions:
        if after < calls_before <= upto:
            made = made.to(dtype)
    return made


@functools.lru_cache(maxsize=None)
def _signature(function: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without one (Tensor.uniform_ takes generator= by keyword only)
        return None


def _generator_of(function: Callable[..., Any], args: tuple, kwargs: dict) -> torch.Generator | None:
    """The `generator` an initializer was given, by keyword or by place (`init.normal_(p, 0, 0.02, g)`)."""
    generator = kwargs.get("generator")
    if generator is None and args and (signature := _signature(function)) is not None:
        try:
            generator = signature.bind_partial(None, *args, **kwargs).arguments.get("generator")
        except TypeError:
            return None
    return generator


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    """Where a draw happens: its `device=`, else its first tensor's device, else None (the default device's
    generator)."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    tensor = next(_tensors_in(args, kwargs), None)
    return tensor.device if tensor is not None else None


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The generator a draw on `device` takes when given none (None for a device that draws nothing, `meta`)."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda" and torch.cuda.is_initialized():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return None


def _project_frame() -> str | None:
    """`train.py:57`: the innermost frame outside torch, this package, the standard library and installed packages
    (a transformers model's own `_init_weights` is not where the project can move a draw); failing that, the
    innermost outside torch, this package and the standard library."""
    skipped = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]), str(Path(contextlib.__file__).parent))
    fallback = None
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skipped) and not filename.startswith("<"):
            place = f"{Path(filename).name}:{frame.f_lineno}"
            if not _INSTALLED.intersection(Path(filename).parts):
                return place
            fallback = fallback or place
        frame = frame.f_back
    return fallback


_INSTALLED = frozenset({"site-packages", "dist-packages"})  # folders installed packages live in


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


def _forget_in_child() -> None:
    """In a process forked while setup() skips (a DataLoader worker made by `iter(loader)` in setup()), the forking
    thread lives on with the same id: without this, its worker's `torch.manual_seed` made the owed calls run there,
    initializing the whole model in every worker (its pages copied, its time spent) for nothing."""
    _recorders.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _settling(original: Callable[..., Any], shown: str, scope: str) -> Callable[..., Any]:
    """`torch.manual_seed` and its kin, during a skipping setup(): the owed draws come before the seed or the read."""

    @functools.wraps(original)
    def seeding(*args: Any, **kwargs: Any) -> Any:
        log = _recorders.get(threading.get_ident())
        if log is not None and log.owed and log.owes_draws_on(scope):
            log.settle(shown)
        return original(*args, **kwargs)

    seeding.__vram_bench_skipping__ = True  # type: ignore[attr-defined]
    return seeding


def _install() -> None:
    for module_name, names in _SEEDING.items():
        module = sys.modules.get(module_name)
        for name, scope in names.items() if module is not None else ():
            original = getattr(module, name, None)
            if original is None or getattr(original, "__vram_bench_skipping__", False):
                continue
            _seeding_originals[(module_name, name)] = original
            setattr(module, name, _settling(original, f"{module_name}.{name}", scope))
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
    for (module_name, name), original in _seeding_originals.items():
        setattr(sys.modules[module_name], name, original)
    _seeding_originals.clear()


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
        log.make_kept_views()
        log.check_unseen_draws()
    finally:
        with _lock:
            _recorders.pop(me, None)
            if not _recorders:
                _uninstall()
