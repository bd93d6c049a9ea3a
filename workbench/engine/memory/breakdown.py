"""Where a session's memory goes: parameters, gradients, optimizer state, buffers,
activations and the allocator's cache, with one-line advice where a part dominates.

The static parts are exact: we sum the tensors the user's state holds (found with
`workbench.engine.state_walk`), counting each storage once, so tied or viewed weights are
not double counted. Activations and the cache cannot be seen by walking the state;
they come from the CUDA allocator's figures (a step's peak, reserved, allocated),
which the caller passes in. On any device the caller may also pass the bytes autograd
saved for backward during one step (`workbench.engine.saved_bytes.SavedBytes`, measured on
the first steps of each code version): where there is no step peak, as on a CPU run,
that figure stands in for activations, labelled for what it is. Without either, those
parts say why they are unknown.

Choices, so callers and tests can rely on them:
- One `Breakdown` per device. Tensors are grouped by `str(tensor.device)`, and the
  CUDA figures (a step peak, reserved, allocated) are per device too, so they only
  make sense next to that device's static bytes. AdamW's scalar `step` tensors live
  on the CPU even for a CUDA model (unless `capturable`/`fused`), so a CUDA model
  usually also yields a small "cpu" Breakdown holding only those.
- A storage is identified by (device, `untyped_storage().data_ptr()`) and counted
  once, at its full `nbytes()`: a parameter that is a view of a larger tensor keeps
  the whole storage alive, so the whole storage is what it costs. A storage is
  attributed to the first part that reaches it, in the order parameters, buffers,
  gradients, optimizer state. Tensors without a plain storage (sparse, some
  subclasses) are counted by their own bytes, since nothing can be shared reliably.
- Meta tensors hold no memory and are skipped.
- The saved-for-backward figure is one number for the whole step. It goes to the
  device that holds the parameters (the first in the list's order, CUDA before
  cpu), where the step's activations live. With a step peak, activations stay the
  peak minus static bytes and the figure is only quoted next to them: the peak also
  holds temporaries freed within the step, which saved tensors do not count.
- Only tensors reachable from modules and optimizers are counted: loose tensors in
  the state (a cached dataset, a saved batch) are not parameters of anything.

Read it between steps when you can: reading while the training thread runs a step
is safe (the optimizer state dict is copied in one step under the GIL) but may see
gradients half-freed or half-created.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workbench.engine.memory.shards import held_here
from workbench.engine.state_walk import find_modules_and_optimizers
from workbench.units import human_bytes
from workbench.engine.versions import SAVED_MEASURE_STEPS

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer state"
BUFFERS = "buffers"
ACTIVATIONS = "activations"
CACHE = "cache / fragmentation"
PART_NAMES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, BUFFERS, ACTIVATIONS, CACHE)
# The label of the activations part when its bytes are autograd's saved tensors, not an allocator peak.
SAVED_FOR_BACKWARD = "saved for backward (last measured step)"

OPTIMIZER_RATIO_ADVICE = 1.5  # optimizer state at least this many times the trainable parameters
FROZEN_SHARE_ADVICE = 0.5  # frozen share of parameter bytes worth pointing out
FP32_PARAMETERS_ADVICE = 1 << 30  # fp32 parameters above this: suggest bf16
CACHE_SHARE_ADVICE = 0.2  # cached-but-unused share of reserved above this: suggest cleanup
EIGHT_BIT_BYTES_PER_ELEMENT = 1  # what an 8-bit optimizer keeps per state element (block scales ignored)

_STATE_DEPTH = 3  # optimizer state values are tensors, or small lists/dicts of them (LBFGS)

FigureArg = int | Mapping[Any, int] | None


@dataclass(frozen=True)
class Part:
    """One slice of a device's memory. `bytes` is None when it cannot be known here; `detail` says why.

    `label`, when set, is what the bytes are when they are a stand-in for the part rather than
    the part itself (SAVED_FOR_BACKWARD for activations on CPU); front ends show it instead of `name`.
    """

    name: str
    bytes: int | None
    detail: str = ""
    label: str = ""


@dataclass(frozen=True)
class Breakdown:
    """Memory on one device, split by what holds it."""

    device: str
    parts: tuple[Part, ...]
    static_bytes: int  # parameters + gradients + optimizer state + buffers
    advice: tuple[str, ...]
    frozen_parameter_bytes: int  # parameters with requires_grad=False: they need no grads or optimizer state
    # Bytes autograd saved for backward during the last measured step (tensors kept for the backward pass,
    # not the allocator's peak), on the device that holds the parameters; None elsewhere or when not measured.
    saved_for_backward: int | None = None

    def part(self, name: str) -> Part:
        """The part called `name` (one of PART_NAMES)."""
        for part in self.parts:
            if part.name == name:
                return part
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- public entry points


def session_breakdown(
    state: Any,
    *,
    step_peak_allocated: FigureArg = None,
    reserved: FigureArg = None,
    allocated: FigureArg = None,
    inactive_split_bytes: FigureArg = None,
    saved_for_backward: int | None = None,
) -> list[Breakdown]:
    """One Breakdown per device holding the state's tensors, CUDA devices first (by index), then cpu.

    Each CUDA figure is either an int, meaning the CUDA device the state uses (the
    lowest-indexed one if it uses several, `cuda:0` if it uses none), or a mapping
    from device (`0`, `"cuda:0"`, a `torch.device`; any device name is accepted, so
    a caller with its own CPU peak may pass `{"cpu": n}`) to bytes. A device that has
    figures but no tensors of the state still gets a Breakdown. The list is empty
    when the state holds no tensors and no figures were given.

    `saved_for_backward` is the bytes autograd saved for backward in the latest step
    that measured them (`VersionTable.latest_saved_bytes()`); None means no step of
    the current code version has been measured yet, and the breakdown says so.
    """
    tallies = _tally_state(state)
    figures = _CudaFigures.build(
        [d for d in tallies if d.startswith("cuda")],
        step_peak_allocated=step_peak_allocated,
        reserved=reserved,
        allocated=allocated,
        inactive_split_bytes=inactive_split_bytes,
    )
    for device in figures.devices():
        tallies.setdefault(device, _DeviceTally())
    if saved_for_backward is not None:
        tallies.setdefault(_parameters_device(tallies), _DeviceTally())
    saved = _SavedFigure(_parameters_device(tallies), saved_for_backward)
    return [_breakdown(device, tallies[device], figures, saved) for device in sorted(tallies, key=_device_order)]


def session_breakdown_for_gpus(
    state: Any,
    gpus: Iterable[Any],
    step_peak_allocated: Mapping[int, int] | None = None,
    *,
    saved_for_backward: int | None = None,
) -> list[Breakdown]:
    """`session_breakdown` fed from the device probe's `GpuMemory` list (reserved, allocated, inactive_split).

    `step_peak_allocated` maps a GPU index to the allocator's peak over one step
    (reset the peak before the step, read `max_memory_allocated` after it).
    `saved_for_backward` is as for `session_breakdown`.
    """
    gpus = list(gpus)

    def figure(attr: str) -> dict[int, int]:
        return {g.index: getattr(g, attr) for g in gpus if getattr(g, attr, None) is not None}

    return session_breakdown(
        state,
        step_peak_allocated=dict(step_peak_allocated or {}),
        reserved=figure("reserved"),
        allocated=figure("allocated"),
        inactive_split_bytes=figure("inactive_split"),
        saved_for_backward=saved_for_backward,
    )


# --------------------------------------------------------------------------- walking the state


@dataclass
class _Tally:
    """Bytes of one part on one device, and what they came from."""

    bytes: int = 0
    tensors: int = 0
    elements: int = 0
    shared: int = 0  # tensors whose storage was already counted (tied weights, views)
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes

    def add(self, tensor: torch.Tensor, nbytes: int | None) -> None:
        """Count `tensor` (a DTensor: its shard here); `nbytes` is None when its storage was already counted."""
        tensor = held_here(tensor)
        self.tensors += 1
        self.elements += tensor.numel()
        if nbytes is None:
            self.shared += 1
            return
        self.bytes += nbytes
        dtype = str(tensor.dtype).removeprefix("torch.")
        self.dtypes[dtype] = self.dtypes.get(dtype, 0) + nbytes


@dataclass
class _DeviceTally:
    """Everything counted on one device."""

    parameters: _Tally = field(default_factory=_Tally)
    frozen: _Tally = field(default_factory=_Tally)  # the frozen subset of `parameters`
    fp32_parameters: int = 0
    gradients: _Tally = field(default_factory=_Tally)
    frozen_gradients: _Tally = field(default_factory=_Tally)  # grads held by frozen parameters
    trainable_without_grad: int = 0  # trainable parameters whose .grad is None
    optimizer: _Tally = field(default_factory=_Tally)
    frozen_optimizer: _Tally = field(default_factory=_Tally)  # state held for frozen parameters
    eight_bit_saving: int = 0  # what 1 byte per element would save on the optimizer's floating vectors
    state_keys: dict[str, None] = field(default_factory=dict)  # ordered set of state names seen
    optimizers: int = 0  # optimizers with state (or, before their first step, parameters) here
    buffers: _Tally = field(default_factory=_Tally)

    @property
    def static_bytes(self) -> int:
        return self.parameters.bytes + self.gradients.bytes + self.optimizer.bytes + self.buffers.bytes

    @property
    def trainable_bytes(self) -> int:
        return self.parameters.bytes - self.frozen.bytes


class _Storages:
    """Each storage once: the first call for a storage returns its bytes, later calls None."""

    def __init__(self) -> None:
        self._seen: set[tuple[Any, ...]] = set()

    def claim(self, tensor: torch.Tensor) -> int | None:
        key, nbytes = _storage_identity(tensor)
        if key in self._seen:
            return None
        self._seen.add(key)
        return nbytes


def _storage_identity(tensor: torch.Tensor) -> tuple[tuple[Any, ...], int]:
    """(identity, bytes) of the memory behind `tensor`; see the module docstring for the choice."""
    tensor = held_here(tensor)
    device = str(tensor.device)
    try:
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except Exception:  # noqa: BLE001 - sparse tensors and some subclasses have no plain storage
        return ("tensor", device, id(tensor)), _own_bytes(tensor)
    if ptr == 0:  # an empty storage: nothing to share, nothing to count
        return ("empty", device, id(tensor)), nbytes
    return ("storage", device, ptr), nbytes


def _own_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor that has no plain storage (sparse: its values and indices)."""
    if tensor.is_sparse:
        return _own_bytes(tensor._values()) + _own_bytes(tensor._indices())
    return tensor.numel() * tensor.element_size()


def _tally_state(state: Any) -> dict[str, _DeviceTally]:
    """Walk the modules and optimizers in `state` and tally their tensors per device."""
    modules, optimizers = find_modules_and_optimizers(state)
    tallies: dict[str, _DeviceTally] = {}
    storages = _Storages()

    def tally(tensor: torch.Tensor) -> _DeviceTally:
        return tallies.setdefault(str(tensor.device), _DeviceTally())

    params = _unique(_all_parameters(modules.values(), optimizers.values()))
    buffers = _unique(b for m in modules.values() for b in m.buffers())
    for p in params:
        _count_parameter(tally(p), p, storages.claim(p))
    for b in buffers:
        tally(b).buffers.add(b, storages.claim(b))
    for p in params:
        if p.grad is None:
            tally(p).trainable_without_grad += int(p.requires_grad)
        elif p.grad.device.type != "meta":
            _count_gradient(tally(p.grad), p, storages.claim(p.grad))
    for opt in optimizers.values():
        _count_optimizer(opt, tally, storages)
    return tallies


def _all_parameters(
    modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> Iterator[torch.Tensor]:
    """Module parameters, then tensors an optimizer trains that no module holds (a bare learned tensor)."""
    for module in modules:
        yield from module.parameters()
    for opt in optimizers:
        for group in opt.param_groups:
            yield from (p for p in group.get("params", ()) if isinstance(p, torch.Tensor))


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Distinct tensor objects, in order, without meta tensors (they hold no memory)."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen and t.device.type != "meta":
            seen.add(id(t))
            out.append(t)
    return out


def _count_parameter(tally: _DeviceTally, param: torch.Tensor, nbytes: int | None) -> None:
    tally.parameters.add(param, nbytes)
    if not param.requires_grad:
        tally.frozen.add(param, nbytes)
    if nbytes and param.dtype == torch.float32:
        tally.fp32_parameters += nbytes


def _count_gradient(tally: _DeviceTally, param: torch.Tensor, nbytes: int | None) -> None:
    tally.gradients.add(param.grad, nbytes)
    if not param.requires_grad:
        tally.frozen_gradients.add(param.grad, nbytes)


def _count_optimizer(
    opt: torch.optim.Optimizer, tally: Callable[[torch.Tensor], _DeviceTally], storages: _Storages
) -> None:
    """Every tensor in the optimizer's per-parameter state, on the device it lives on."""
    touched: dict[int, _DeviceTally] = {}
    entries = list(opt.state.items())  # one step under the GIL, even while the training thread runs
    for param, values in entries:
        frozen = isinstance(param, torch.Tensor) and not param.requires_grad
        for key, tensor in _state_tensors(values, "", 0):
            if tensor.device.type == "meta":
                continue
            device_tally = tally(tensor)
            touched[id(device_tally)] = device_tally
            nbytes = storages.claim(tensor)
            device_tally.optimizer.add(tensor, nbytes)
            device_tally.state_keys.setdefault(key, None)
            if frozen:
                device_tally.frozen_optimizer.add(tensor, nbytes)
            here = held_here(tensor)
            if nbytes and here.is_floating_point() and here.numel() > 1:
                kept = here.numel() * EIGHT_BIT_BYTES_PER_ELEMENT
                device_tally.eight_bit_saving += max(nbytes - kept, 0)
    if not touched:  # no state yet: say so on the devices of the parameters it will train
        for group in opt.param_groups:
            for p in group.get("params", ()):
                if isinstance(p, torch.Tensor) and p.device.type != "meta":
                    touched[id(tally(p))] = tally(p)
    for device_tally in touched.values():
        device_tally.optimizers += 1


def _state_tensors(value: Any, key: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(state name, tensor) for every tensor in one parameter's optimizer state."""
    if isinstance(value, torch.Tensor):
        yield key or "state", value
    elif depth < _STATE_DEPTH and isinstance(value, Mapping):
        for k, v in list(value.items()):
            yield from _state_tensors(v, key or str(k), depth + 1)
    elif depth < _STATE_DEPTH and isinstance(value, (list, tuple)):
        for v in list(value):
            yield from _state_tensors(v, key, depth + 1)


# --------------------------------------------------------------------------- CUDA figures


@dataclass(frozen=True)
class _CudaFigures:
    """The allocator's figures, per CUDA device name ("cuda:0")."""

    peak: dict[str, int]
    reserved: dict[str, int]
    allocated: dict[str, int]
    inactive_split: dict[str, int]

    @classmethod
    def build(cls, state_cuda_devices: Sequence[str], **figures: FigureArg) -> _CudaFigures:
        default = min(state_cuda_devices, key=_device_order) if state_cuda_devices else "cuda:0"
        return cls(
            peak=_per_device(figures["step_peak_allocated"], default),
            reserved=_per_device(figures["reserved"], default),
            allocated=_per_device(figures["allocated"], default),
            inactive_split=_per_device(figures["inactive_split_bytes"], default),
        )

    def devices(self) -> set[str]:
        return set(self.peak) | set(self.reserved) | set(self.allocated) | set(self.inactive_split)


def _per_device(figure: FigureArg, default: str) -> dict[str, int]:
    if figure is None:
        return {}
    if isinstance(figure, Mapping):
        return {_device_name(k): int(v) for k, v in figure.items() if v is not None}
    return {default: int(figure)}


def _device_name(key: Any) -> str:
    """0, "cuda:0", "cuda" or torch.device("cuda", 0) -> "cuda:0"; "cpu" stays "cpu"."""
    if isinstance(key, int):
        return f"cuda:{key}"
    device = torch.device(key)
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    return str(device)


def _parameters_device(tallies: Mapping[str, _DeviceTally]) -> str:
    """Where the step's activations live: the first device holding parameters, else the first device, else cpu."""
    devices = sorted(tallies, key=_device_order)
    holding = [d for d in devices if tallies[d].parameters.tensors]
    return (holding or devices or ["cpu"])[0]


@dataclass(frozen=True)
class _SavedFigure:
    """The saved-for-backward bytes (None: not measured yet) and the one device they belong to."""

    device: str
    bytes: int | None


def _device_order(device: str) -> tuple[int, int, str]:
    """CUDA devices first, by index; then cpu; then anything else by name."""
    kind, _, index = device.partition(":")
    rank = {"cuda": 0, "cpu": 1}.get(kind, 2)
    return rank, int(index) if index.isdigit() else 0, device


# --------------------------------------------------------------------------- building a Breakdown


def _breakdown(device: str, tally: _DeviceTally, figures: _CudaFigures, saved: _SavedFigure) -> Breakdown:
    static = tally.static_bytes
    activations = _activations_part(device, static, tally, figures, saved)
    cache = _cache_part(device, figures)
    parts = (
        Part(PARAMETERS, tally.parameters.bytes, _parameters_detail(tally)),
        Part(GRADIENTS, tally.gradients.bytes, _gradients_detail(tally)),
        Part(OPTIMIZER_STATE, tally.optimizer.bytes, _optimizer_detail(tally)),
        Part(BUFFERS, tally.buffers.bytes, _tensors_detail(tally.buffers, "buffers")),
        activations,
        cache,
    )
    return Breakdown(
        device=device,
        parts=parts,
        static_bytes=static,
        advice=tuple(_advice(device, tally, activations, cache, figures)),
        frozen_parameter_bytes=tally.frozen.bytes,
        saved_for_backward=saved.bytes if device == saved.device else None,
    )


def _tensors_detail(t: _Tally, what: str = "tensors") -> str:
    if not t.tensors:
        return f"no {what}"
    text = f"{t.elements:,} elements in {t.tensors:,} tensors"
    if t.dtypes:
        text += " (" + ", ".join(sorted(t.dtypes, key=t.dtypes.__getitem__, reverse=True)) + ")"
    if t.shared:
        text += f"; {t.shared:,} share storage with another tensor, counted once"
    return text


def _parameters_detail(tally: _DeviceTally) -> str:
    text = _tensors_detail(tally.parameters, "parameters")
    if tally.parameters.bytes:
        text += f"; trainable {_percent(tally.trainable_bytes, tally.parameters.bytes)}"
    return text


def _gradients_detail(tally: _DeviceTally) -> str:
    text = _tensors_detail(tally.gradients, "gradients held")
    if tally.trainable_without_grad:
        text += (
            f"; {tally.trainable_without_grad:,} trainable parameters hold no .grad"
            " (before the first backward, or zero_grad(set_to_none=True))"
        )
    if tally.frozen_gradients.tensors:
        text += f"; {human_bytes(tally.frozen_gradients.bytes)} belongs to frozen parameters"
    return text


def _optimizer_detail(tally: _DeviceTally) -> str:
    if not tally.optimizer.tensors:
        if tally.optimizers:
            return "the optimizer holds no state yet (it is created on its first step)"
        return "no optimizer state here"
    return ", ".join(tally.state_keys) + f" ({tally.optimizer.tensors:,} tensors)"


_SAVED_WHEN = f"measured on the first {SAVED_MEASURE_STEPS} steps of each code version"


def _activations_part(
    device: str, static: int, tally: _DeviceTally, figures: _CudaFigures, saved: _SavedFigure
) -> Part:
    peak = figures.peak.get(device)
    mine = device == saved.device
    if peak is not None:
        detail = f"step peak {human_bytes(peak)} minus static {human_bytes(static)}"
        if peak < static:
            detail += "; clamped at 0: the peak is below the static total (was it reset mid-step?)"
        if tally.trainable_without_grad:
            detail += "; gradients were not held when counted, so this includes the gradients made in backward"
        if mine and saved.bytes is not None:
            detail += (
                f"; autograd saved {human_bytes(saved.bytes)} for backward in the last measured step "
                "(the tensors kept for the backward pass; the peak also holds temporaries)"
            )
        return Part(ACTIVATIONS, max(peak - static, 0), detail)
    if mine and saved.bytes is not None:
        detail = (
            "the activations autograd saved for backward during one step: tensors kept for the backward pass, "
            f"counted once per storage, parameters excluded; {_SAVED_WHEN}. Not an allocator peak "
            "(temporaries freed within the step are not in it)"
        )
        return Part(ACTIVATIONS, saved.bytes, detail, label=SAVED_FOR_BACKWARD)
    if device.startswith("cuda"):
        why = "needs a CUDA step peak (the allocator's max_memory_allocated over one step)"
        if mine:
            why += f"; no bytes saved for backward measured yet either ({_SAVED_WHEN})"
    elif mine:
        why = (
            f"not measured yet: the bytes autograd saves for backward are {_SAVED_WHEN} "
            "(a CPU run has no allocator peak to read)"
        )
    else:
        why = "needs a CUDA step peak (a CPU run has no allocator peak to read)"
    return Part(ACTIVATIONS, None, why)


def _cache_part(device: str, figures: _CudaFigures) -> Part:
    reserved, allocated = figures.reserved.get(device), figures.allocated.get(device)
    if reserved is None or allocated is None:
        if device.startswith("cuda"):
            return Part(CACHE, None, "needs the allocator's reserved and allocated figures")
        return Part(CACHE, None, "only the CUDA caching allocator keeps a cache")
    cached = max(reserved - allocated, 0)
    detail = f"reserved {human_bytes(reserved)} minus allocated {human_bytes(allocated)}"
    inactive = figures.inactive_split.get(device)
    if inactive is not None:
        detail += f"; {human_bytes(inactive)} of it is in split blocks that empty_cache cannot return"
    return Part(CACHE, cached, detail)


# --------------------------------------------------------------------------- advice


def _advice(device: str, tally: _DeviceTally, activations: Part, cache: Part, figures: _CudaFigures) -> Iterator[str]:
    """One line per part that dominates, with what it would save."""
    yield from _optimizer_advice(tally)
    yield from _frozen_advice(tally)
    yield from _fp32_advice(tally)
    yield from _activations_advice(tally, activations)
    yield from _cache_advice(figures.reserved.get(device), figures.inactive_split.get(device), cache)


def _optimizer_advice(tally: _DeviceTally) -> Iterator[str]:
    trainable = tally.trainable_bytes
    state = tally.optimizer.bytes
    if trainable <= 0 or state < OPTIMIZER_RATIO_ADVICE * trainable:
        return
    ratio = state / trainable
    yield (
        f"optimizer state is {ratio:.1f}x the parameters ({human_bytes(state)}): an 8-bit optimizer "
        f"would save {human_bytes(tally.eight_bit_saving)} (assuming 1 byte per state element), "
        f"CPU offload all {human_bytes(state)}"
    )


def _frozen_advice(tally: _DeviceTally) -> Iterator[str]:
    wasted = tally.frozen_gradients.bytes + tally.frozen_optimizer.bytes
    if wasted:
        yield (
            f"frozen parameters still hold {human_bytes(wasted)} of gradients or optimizer state: "
            "set their .grad to None and build the optimizer over trainable parameters only"
        )
    params = tally.parameters.bytes
    frozen = tally.frozen.bytes
    if params and frozen >= FROZEN_SHARE_ADVICE * params:
        line = (
            f"{_percent(frozen, params)} of parameters are frozen ({human_bytes(frozen)}): "
            "they need no gradients or optimizer state"
        )
        frozen_fp32 = tally.frozen.dtypes.get("float32", 0)
        if frozen_fp32:
            line += f"; keeping them in bf16 would save {human_bytes(frozen_fp32 // 2)}"
        yield line


def _fp32_advice(tally: _DeviceTally) -> Iterator[str]:
    fp32 = tally.fp32_parameters
    if fp32 > FP32_PARAMETERS_ADVICE:
        yield (
            f"{human_bytes(fp32)} of parameters are fp32: bf16 weights would save {human_bytes(fp32 // 2)} "
            "(or keep fp32 masters and run the step under torch.autocast(dtype=torch.bfloat16))"
        )


def _activations_advice(tally: _DeviceTally, activations: Part) -> Iterator[str]:
    if activations.bytes is not None and activations.bytes > tally.static_bytes:
        what = "activations saved for backward" if activations.label == SAVED_FOR_BACKWARD else "activations"
        yield (
            f"{what} ({human_bytes(activations.bytes)}) outweigh parameters, gradients and optimizer state "
            f"({human_bytes(tally.static_bytes)}): activation checkpointing "
            "(torch.utils.checkpoint, use_reentrant=False) or a smaller batch would cut them"
        )


def _cache_advice(reserved: int | None, inactive_split: int | None, cache: Part) -> Iterator[str]:
    if not reserved or cache.bytes is None or cache.bytes <= CACHE_SHARE_ADVICE * reserved:
        return
    line = (
        f"{human_bytes(cache.bytes)} ({_percent(cache.bytes, reserved)} of reserved) is cached but unused: "
        "call cleanup (c) to return it to the driver"
    )
    if inactive_split and inactive_split * 2 >= cache.bytes:
        line += (
            f"; {human_bytes(inactive_split)} of it is fragmentation cleanup cannot return "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids most of it)"
        )
    yield line


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"
