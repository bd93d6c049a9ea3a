"""A step's loss and scalars, read once they are ready rather than the moment the step returns.

Reading a CUDA tensor's value (`.item()`) waits for every kernel queued so far: the CPU cannot queue the next step
while the GPU runs this one, so the GPU idles through whatever runs between two steps (vram-bench's bookkeeping, the
user's Python up to the next kernel). A plain loop that logs every N steps never waits. So a one-element tensor on an
asynchronous device is copied to the host without waiting, an event marks the end of the copy, and the worker reads
it after the next step has been queued (or sooner, when the copy is already done or something needs the value: a
command, a pause, the end of the run). Anything else (a float, a CPU tensor) is read at once, as before: on a CPU
nothing changes. A value that is not a loss is refused at once, wherever it lives.

The device side is one small seam (`DeferredReader`): CUDA's in `CUDA_READER`; the tests register a pretend device.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


def to_scalar(value: Any, name: str) -> float:
    """A Python number or a one-element tensor as a float; anything else is the user's mistake."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name!r} is a tensor of shape {tuple(value.shape)}; log a scalar (e.g. .mean())")
        return float(value.item())  # no detach(): item() reads the value, autograd or not
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name!r} is a {type(value).__name__}; log numbers or one-element tensors") from None
    return float(value)


class StepOutputError(TypeError):
    """`step` returned something that is not a loss."""


def scalar_now(value: Any, name: str, said: str) -> float:
    """A value read at once (`said`: who returned it, "evaluate() returned "); `StepOutputError` if not a number."""
    try:
        return to_scalar(value, name)
    except TypeError as exc:
        raise StepOutputError(f"{said}{exc}") from None


class DeferredReader(Protocol):
    """How one kind of device hands a scalar to the host without waiting for the device."""

    def accepts(self, value: Any) -> bool:
        """A one-element value on this device, read without waiting."""

    def keep(self, value: Any) -> Any:
        """The value as it is now, safe from the user's later in-place changes (`bench.log` mid-step)."""

    def copy(self, value: Any) -> Any:
        """Start the copy to the host; what will hold the value once `mark`'s event has happened."""

    def mark(self, values: list[Any]) -> Any:
        """What marks the end of the copies of `values` (started so far on their devices)."""

    def ready(self, mark: Any) -> bool: ...

    def wait(self, mark: Any) -> None: ...

    def read(self, copied: Any) -> float:
        """The value of a finished copy, without waiting."""


class CudaReader:
    """CUDA: a non-blocking copy into pinned host memory, and a CUDA event recorded after it on the same stream."""

    def accepts(self, value: Any) -> bool:
        return type(value) is torch.Tensor and value.is_cuda and value.numel() == 1

    def keep(self, value: Any) -> Any:
        return value.detach().clone()  # queued on the device like the rest: no wait

    def copy(self, value: Any) -> Any:
        return value.detach().to("cpu", non_blocking=True)  # into pinned memory: asynchronous

    def mark(self, values: list[Any]) -> Any:
        events = []
        for device in dict.fromkeys(value.device for value in values):  # a model split over GPUs: one event each
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return events

    def ready(self, mark: Any) -> bool:
        return all(event.query() for event in mark)

    def wait(self, mark: Any) -> None:
        for event in mark:
            event.synchronize()

    def read(self, copied: Any) -> float:
        return float(copied.item())  # a host tensor: no device wait


CUDA_READER = CudaReader()
READERS: list[DeferredReader] = [CUDA_READER]  # tests add a pretend device here


class StepValues:
    """The loss and scalars of one step: read, or some of them still on their way from a device (`reader` set)."""

    __slots__ = ("loss", "mark", "pending", "reader", "scalars")

    def __init__(self, loss: float | None = None, scalars: dict[str, float | None] | None = None) -> None:
        # Made every step: plain slots, no dataclass machinery.
        self.loss = loss
        self.scalars: dict[str, float | None] = {} if scalars is None else scalars
        self.pending: list[tuple[str | None, Any]] = []  # (scalar name, or None for the loss; the copy's holder)
        self.reader: DeferredReader | None = None
        self.mark: Any = None

    @property
    def ready(self) -> bool:
        return self.reader is None or self.reader.ready(self.mark)

    def read(self) -> tuple[float, dict[str, float]]:
        """(loss, scalars), waiting for the device if the copies have not finished."""
        if self.reader is not None:
            self.reader.wait(self.mark)
            for name, copied in self.pending:
                value = self.reader.read(copied)
                if name is None:
                    self.loss = value
                else:
                    self.scalars[name] = value
            self.reader, self.pending = None, []
        assert self.loss is not None
        return self.loss, self.scalars  # type: ignore[return-value]


class StepRecord:
    """A finished step as the worker reports it: its number and values; when it started (perf_counter) and its time
    (`ms`: until it returned, or for a `late` one, whose values were read after the next step was queued, the time
    from the previous step's values to its own: the GPU's pace); its code version, when it ended (Unix time), what
    autograd saved (when measured) and its GPU peak (when one was read)."""

    __slots__ = ("ended", "gpu", "late", "ms", "peak", "saved_bytes", "started", "step", "values", "version")

    def __init__(self, step: int, values: StepValues, started: float, ms: float, late: bool, version: int,
                 ended: float, saved_bytes: int | None, gpu: int | None, peak: int | None) -> None:
        self.step, self.values, self.started, self.ms, self.late = step, values, started, ms, late
        self.version, self.ended, self.saved_bytes, self.gpu, self.peak = version, ended, saved_bytes, gpu, peak


def start_reading(out: Any, logged: dict[str, Any]) -> StepValues:
    """What `step` returned (a number / one-element tensor, or a dict of them with "loss") and what it logged with
    `bench.log`, each read now or copied off its device; raises `StepOutputError` for anything that is not a loss."""
    kind = type(out)
    if not logged and (kind is float or (kind is torch.Tensor and not out.is_cuda)):  # the usual step, read at once
        return StepValues(scalar_now(out, "loss", "step() returned "))
    if isinstance(out, dict):
        if "loss" not in out:
            raise StepOutputError(f"step() returned a dict without a 'loss' key (keys: {', '.join(map(str, out)) or 'none'})")
        named = {str(k): v for k, v in out.items()}
    elif out is None:
        raise StepOutputError("step() returned None; return the loss (a float or a 0-d tensor) or a dict with 'loss'")
    else:
        named = {"loss": out}
    values = StepValues()
    copied: list[Any] = []
    for source, prefix in ((named, "step() returned "), (logged, "bench.log: ")):
        for name, value in source.items():
            target = None if source is named and name == "loss" else name
            reader = _reader_for(value)
            if reader is not None and (values.reader is None or values.reader is reader):
                values.pending.append((target, reader.copy(value)))
                values.reader = reader
                copied.append(value)
                read: float | None = None
            else:
                read = scalar_now(value, name, prefix)  # a host value, or a second device kind: read now (rare)
            if target is None:
                values.loss = read
            else:
                values.scalars[name] = read
    if values.reader is not None:
        values.mark = values.reader.mark(copied)
    return values


def kept_for_later(value: Any) -> Any | None:
    """For `bench.log`: a device value kept as it is now, to be read with the step's loss; None for any other value
    (read at once, so a value that is not a number is refused at the line that logged it)."""
    reader = _reader_for(value)
    return reader.keep(value) if reader is not None else None


def _reader_for(value: Any) -> DeferredReader | None:
    if isinstance(value, (int, float)):  # the common host values, without asking every reader
        return None
    for reader in READERS:
        if reader.accepts(value):
            return reader
    return None
