"""Events the engine emits and commands it accepts.

One module so the TUI, the headless printer, the event log and the tests all
share the same small frozen types. `to_dict` gives the stable JSON-lines schema
documented in README.md ("Headless protocol").
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Event:
    """Base of every event; `name` is the value of the `"event"` JSON key."""

    name: ClassVar[str] = "event"
    # Optional fields added to the schema later, left out of the JSON while None (readers default them).
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()
    time: float = field(default_factory=_now, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"event": self.name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.omitted_when_none:
                continue
            data[f.name] = _jsonable(value)
        return data

    def to_json(self) -> str:
        """The event's JSON line (without the newline). Kept on the event: every reader of a step (the event log,
        stdout, each client) writes the same text, and an event never changes once published."""
        try:
            return self.__dict__["_json"]
        except KeyError:
            text = self._encode()
            object.__setattr__(self, "_json", text)
            return text

    def _encode(self) -> str:
        """`to_dict` as JSON, written field by field: numbers, strings and None directly, anything else through
        json.dumps. The same text as `json.dumps(self.to_dict())`, about 3x faster for a step: every rank's every
        step is encoded once for its readers, beside a training loop that any CPU taken from it slows."""
        parts = ['{"event":', _string(self.name)]
        for name, key, omitted in _json_fields(type(self)):
            value = getattr(self, name)
            kind = type(value)
            if kind is float:
                text = float.__repr__(value) if math.isfinite(value) else f'"{_jsonable(value)}"'
            elif kind is int:
                text = int.__repr__(value)
            elif kind is str:
                text = _string(value)
            elif value is None:
                if omitted:
                    continue
                text = "null"
            elif not value and (kind is dict or kind is tuple or kind is list):
                text = "{}" if kind is dict else "[]"
            else:  # containers, bools, subclasses of float or int (NumPy's): as json.dumps writes them
                text = json.dumps(_jsonable(value), allow_nan=False, separators=(",", ":"))
            parts += (key, text)
        parts.append("}")
        return "".join(parts)


_string = json.JSONEncoder().encode  # a str as json.dumps writes it (ASCII, escaped)
_JSON_FIELDS: dict[type, tuple[tuple[str, str, bool], ...]] = {}


def _json_fields(kind: type) -> tuple[tuple[str, str, bool], ...]:
    """An event type's fields as (name, its `,"name":` prefix, left out while None), worked out once per type."""
    try:
        return _JSON_FIELDS[kind]
    except KeyError:
        found = tuple((f.name, f',"{f.name}":', f.name in kind.omitted_when_none) for f in dataclasses.fields(kind))
        _JSON_FIELDS[kind] = found
        return found


def jsonable(value: Any) -> Any:
    """A value as `to_dict` writes it: tuples become lists, NaN/Inf become "nan"/"inf"/"-inf"."""
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    """NaN/Inf are not JSON: they travel as strings ("nan", "inf", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class Start(Event):
    name: ClassVar[str] = "start"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"rank", "world_size", "backend", "restart"})
    project: str
    device: str
    version: str
    torch: str
    pid: int
    # Under torchrun: this process's rank, how many there are, and the training group's backend (nccl, gloo).
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    restart: int | None = None  # torchrun started every rank again (--max-restarts): 1, 2, ... (absent before)


@dataclass(frozen=True)
class Setup(Event):
    """`setup()` began (`status="running"`), finished (`"done"`) or raised (`"failed"`)."""

    name: ClassVar[str] = "setup"
    status: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Step(Event):
    name: ClassVar[str] = "step"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"peak_allocated", "gpu", "saved_bytes", "rank"})
    step: int
    loss: float
    ms: float
    scalars: dict[str, float] = field(default_factory=dict)
    code_version: int = 0
    # Optional (None when not measured): the step's peak of live tensors on GPU `gpu`, and what autograd
    # saved for backward on the steps of a version that are measured (the versions table's figures).
    peak_allocated: int | None = None
    gpu: int | None = None
    saved_bytes: int | None = None
    rank: int | None = None  # under torchrun: which rank trained this step (rank 0 streams every rank's, up to 8)

    @classmethod
    def quick(cls, step: int, loss: float, ms: float, scalars: dict[str, float], code_version: int, *,
              peak_allocated: int | None = None, gpu: int | None = None, saved_bytes: int | None = None,
              rank: int | None = None, time: float | None = None) -> Step:
        """The same event as `Step(...)`, made in a third of the time: a frozen dataclass sets each field through
        object.__setattr__, and every rank makes one of these per step on its training thread (rank 0 one more for
        each other rank's), beside a loop that any CPU taken from it slows."""
        event = object.__new__(cls)
        event.__dict__.update(time=_now() if time is None else time, step=step, loss=loss, ms=ms, scalars=scalars,
                              code_version=code_version, peak_allocated=peak_allocated, gpu=gpu,
                              saved_bytes=saved_bytes, rank=rank)
        return event

    def _encode(self) -> str:
        """The usual step (finite floats, int counters, no GPU fields) in one f-string: 2-3x faster than the
        field-by-field encoder, which writes every other step. The same text either way. Rank 0 encodes every rank's
        steps it streams (thousands a second for a small model) beside its training thread."""
        d = self.__dict__
        time_, loss, ms, scalars, rank = d["time"], d["loss"], d["ms"], d["scalars"], d["rank"]
        if (type(time_) is float and type(loss) is float and type(ms) is float and type(d["step"]) is int
                and type(d["code_version"]) is int and d["peak_allocated"] is None and d["gpu"] is None
                and d["saved_bytes"] is None and (rank is None or type(rank) is int) and type(scalars) is dict
                and math.isfinite(loss) and math.isfinite(ms) and math.isfinite(time_)):
            written = _finite_floats(scalars) if scalars else "{}"
            if written is not None:
                tail = "}" if rank is None else f',"rank":{int.__repr__(rank)}}}'
                return (f'{{"event":"step","time":{float.__repr__(time_)},"step":{int.__repr__(d["step"])},'
                        f'"loss":{float.__repr__(loss)},"ms":{float.__repr__(ms)},"scalars":{written},'
                        f'"code_version":{int.__repr__(d["code_version"])}{tail}')
        return super()._encode()


def _finite_floats(scalars: dict[str, float]) -> str | None:
    """A dict of str keys and finite float values as json.dumps writes it; None for anything else."""
    parts = []
    for key, value in scalars.items():
        if type(key) is not str or type(value) is not float or not math.isfinite(value):
            return None
        parts.append(f"{_string(key)}:{float.__repr__(value)}")
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class Evaluation(Event):
    """What `evaluate(state, bench)` returned, at a global step."""

    name: ClassVar[str] = "evaluate"
    step: int
    scalars: dict[str, float] = field(default_factory=dict)
    ms: float = 0.0


@dataclass(frozen=True)
class Reload(Event):
    name: ClassVar[str] = "reload"
    ok: bool
    file: str
    changed: tuple[str, ...] = ()
    ms: float = 0.0
    code_version: int = 0
    error: str | None = None
    line: int | None = None
    notes: tuple[str, ...] = ()
    # Held back because the live state was built by the old code: names that would change, and why.
    held: tuple[str, ...] = ()
    needs_rebuild: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rebuilt(Event):
    """`setup()` ran again with the new code; trained tensors and optimizer state were carried over."""

    name: ClassVar[str] = "rebuild"
    ok: bool
    seconds: float = 0.0
    code_version: int = 0
    changed: tuple[str, ...] = ()
    tensors_carried: int = 0
    tensors_shared: int = 0  # of those, handed over without a copy (same device and dtype)
    optimizer_states_carried: int = 0
    schedulers_carried: int = 0  # LR schedulers setup() made again that go on from the old one's place
    new: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Paused(Event):
    name: ClassVar[str] = "paused"
    reason: str
    step: int = 0


@dataclass(frozen=True)
class Resumed(Event):
    name: ClassVar[str] = "resumed"
    reason: str
    step: int = 0


@dataclass(frozen=True)
class Snapshot(Event):
    name: ClassVar[str] = "snapshot"
    path: str
    bytes: int
    step: int = 0
    seconds: float = 0.0
    reason: str = "requested"  # or "final" (on quit, a signal, --max-steps), "periodic" (--snapshot-every), "memory limit"
    # What the snapshot does not keep although it was found: a loader's or project object's state that could not be
    # taken or is not plain data ("train.ema: its state_dict() holds ..."; "rank 1: ..." for another rank's).
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResumeLoaded(Event):
    """Weights, optimizer state and RNG from a snapshot were loaded into what setup() built."""

    name: ClassVar[str] = "resume"
    ok: bool
    path: str
    step: int = 0
    tensors: int = 0
    optimizers: int = 0
    seconds: float = 0.0
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = ()
    initialized: tuple[str, ...] = ()  # tensors the snapshot did not have: initialized as setup() does
    mapped: int = 0  # tensors that use the snapshot file's pages (no copy; CPU, same dtype)
    late: bool = False  # an optimizer step() made after the resume got its state from the snapshot (or did not)
    schedulers: int = 0  # LR schedulers loaded: their schedules go on from the snapshot's step


@dataclass(frozen=True)
class Cleanup(Event):
    name: ClassVar[str] = "cleanup"
    freed_bytes: int
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile(Event):
    """`status="started"` when profiling begins, `"done"` with the trace path, `"cancelled"` on `profile 0`."""

    name: ClassVar[str] = "profile"
    status: str
    steps: int
    trace: str | None = None
    top_ops: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class MemorySnapshotTaken(Event):
    """A CUDA memory snapshot for pytorch.org/memory_viz, and a text summary of it."""

    name: ClassVar[str] = "memory_snapshot"
    path: str
    bytes: int
    reason: str = "requested"
    summary: tuple[str, ...] = ()


@dataclass(frozen=True)
class BreakdownReady(Event):
    """Where the session's memory goes, per device (see workbench/engine/memory/breakdown.py)."""

    name: ClassVar[str] = "breakdown"
    step: int
    devices: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class LeaksFound(Event):
    """A census of live tensors by owner, and the largest unowned ones with what keeps them alive."""

    name: ClassVar[str] = "leaks"
    step: int
    total_bytes: int
    unowned_bytes: int
    seconds: float
    groups: tuple[dict[str, Any], ...] = ()
    suspects: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Memory(Event):
    name: ClassVar[str] = "memory"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"swap_used_bytes"})
    rss_bytes: int
    rss_anon_bytes: int
    rss_file_bytes: int
    system_total_bytes: int
    system_available_bytes: int
    # The real ceiling: the memory cgroup's limit where one applies (nested: the smallest), else the host's RAM.
    limit_bytes: int | None = None
    limit_source: str | None = None  # "cgroup v2 /user.slice/job-1", "cgroup v1 /docker/abc" or "host"
    cgroup_usage_bytes: int | None = None  # what the limiting cgroup holds (all its processes, page cache too)
    gpus: tuple[dict[str, Any], ...] = ()
    gpu_note: str | None = None
    swap_used_bytes: int | None = None  # None: not sent (older sessions)


# `where` values of errors that are warnings: nothing failed and training goes on.
WARNINGS = frozenset({"slow step", "eval mode", "contract", "run folder", "time limit", "pausing", "memory limit", "requeued",
                      "torchrun", "restart", "stopping", "waiting", "recovery",
                      "parameters", "loader", "watching"})


@dataclass(frozen=True)
class Error(Event):
    """Something the user should see: `where` says which phase (step, setup, reload, command)."""

    name: ClassVar[str] = "error"
    where: str
    message: str
    file: str | None = None
    line: int | None = None
    traceback: str | None = None

    @property
    def is_warning(self) -> bool:
        return self.where in WARNINGS


@dataclass(frozen=True)
class Print(Event):
    """A line the user's code printed (stdout or stderr), never raw bytes on our stdout."""

    name: ClassVar[str] = "print"
    stream: str
    text: str


@dataclass(frozen=True)
class CommandSent(Event):
    """A command that an attached client sent (`client` names it): every client's log says who did what."""

    name: ClassVar[str] = "command"
    client: str
    command: str


@dataclass(frozen=True)
class Ranks(Event):
    """Under torchrun, from rank 0 at most once a second: every rank's summary, and the slowest (a straggler).

    Each summary: `rank`, `step`, `steps_per_second`, `loss`, `step_ms` (its last step), `code_version`, `state`,
    `rss_bytes`, `gpu_allocated_bytes`, `gpu_reserved_bytes` (null while not measured)."""

    name: ClassVar[str] = "ranks"
    ranks: tuple[dict[str, Any], ...]
    slowest: int | None = None  # the rank with the longest last step, when it is 20% slower than the median


@dataclass(frozen=True)
class Exit(Event):
    name: ClassVar[str] = "exit"
    reason: str
    step: int
    code: int = 0


# --------------------------------------------------------------------------- decoding


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def float_from_json(value: Any) -> Any:
    """The inverse of how NaN/Inf travel ("nan", "inf", "-inf"); anything else is returned as it is."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    return value


class _Mismatch(Exception):
    """A value of the wrong JSON type; `expected` says what the field takes."""

    def __init__(self, expected: str, value: Any) -> None:
        super().__init__(expected)
        self.expected, self.value = expected, value


def _decode_float(value: Any) -> float:
    value = float_from_json(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch('a number (or "nan", "inf", "-inf")', value)
    return float(value)


def _decode_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Mismatch("a whole number", value)
    return value


def _exact(kind: type, expected: str) -> Any:
    def decode(value: Any) -> Any:
        if not isinstance(value, kind):
            raise _Mismatch(expected, value)
        return value

    return decode


def _decoder(hint: Any) -> Any:
    """A function turning the JSON form of a value of type `hint` back into it (or raising _Mismatch)."""
    if hint is float:
        return _decode_float
    if hint is int:
        return _decode_int
    if hint is bool:
        return _exact(bool, "true or false")
    if hint is str:
        return _exact(str, "a string")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        decode_inner = _decoder(inner[0]) if len(inner) == 1 else (lambda v: v)
        return lambda value: None if value is None else decode_inner(value)
    if origin is tuple:
        decode_item = _decoder(args[0]) if args else (lambda v: v)

        def decode_tuple(value: Any) -> tuple[Any, ...]:
            if not isinstance(value, (list, tuple)):
                raise _Mismatch("a list", value)
            return tuple(decode_item(v) for v in value)

        return decode_tuple
    if origin is dict:
        decode_value = _decoder(args[1]) if len(args) == 2 else (lambda v: v)

        def decode_dict(value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise _Mismatch("an object", value)
            return {k: decode_value(v) for k, v in value.items()}

        return decode_dict
    return lambda value: value  # Any, and nested dicts: as JSON has them


_EVENT_TYPES: dict[str, type[Event]] = {}
_FIELD_DECODERS: dict[type[Event], tuple[tuple[str, Any, bool], ...]] = {}


def event_types() -> dict[str, type[Event]]:
    """Every Event subclass by its wire name (`"step"` -> Step), subclasses of subclasses included."""
    found: dict[str, type[Event]] = {}
    pending = list(Event.__subclasses__())
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        found.setdefault(kind.name, kind)
    return found


def _fields_of(kind: type[Event]) -> tuple[tuple[str, Any, bool], ...]:
    """(name, decoder, required) for every field of an event type; worked out once per type."""
    fields = _FIELD_DECODERS.get(kind)
    if fields is None:
        hints = typing.get_type_hints(kind)
        fields = tuple(
            (f.name, _decoder(hints[f.name]), f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(kind)
        )
        _FIELD_DECODERS[kind] = fields
    return fields


def event_from_dict(data: dict[str, Any]) -> Event:
    """The inverse of `Event.to_dict()`: the event a JSON-lines object describes.

    Keys this version does not know are ignored (a newer session may send more); an unknown event
    name, a missing required field or a value of the wrong type raises ValueError saying which.
    """
    if not isinstance(data, dict):
        raise ValueError(f"an event is a JSON object, not {type(data).__name__}")
    name = data.get("event")
    if name is None:
        raise ValueError(f'not an event: the object has no "event" key (keys: {", ".join(map(str, data)) or "none"})')
    kind = _EVENT_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        _EVENT_TYPES.update(event_types())  # an event type defined since the last look
        kind = _EVENT_TYPES.get(name) if isinstance(name, str) else None
        if kind is None:
            raise ValueError(f"unknown event {_shown(str(name))}; known events: {', '.join(sorted(_EVENT_TYPES))}")
    values: dict[str, Any] = {}
    for field_name, decode, required in _fields_of(kind):
        if field_name not in data:
            if required:
                raise ValueError(f"event {name!r} is missing its {field_name!r} field")
            continue
        try:
            values[field_name] = decode(data[field_name])
        except _Mismatch as bad:
            raise ValueError(
                f"event {name!r}: field {field_name!r} should be {bad.expected}, not {_shown(json.dumps(bad.value))}"
            ) from None
    return kind(**values)


def event_from_json(line: str) -> Event:
    """One JSON line (as `Event.to_json()` writes it) back into its event; ValueError when it is not one."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a JSON line ({exc.msg} at character {exc.pos}): {_shown(line)}") from None
    return event_from_dict(data)


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    """Base of every command; `word` is what a user types on stdin."""

    word: ClassVar[str] = ""


@dataclass(frozen=True)
class Pause(Command):
    word: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume(Command):
    word: ClassVar[str] = "resume"


@dataclass(frozen=True)
class StepOnce(Command):
    word: ClassVar[str] = "step"


@dataclass(frozen=True)
class ReloadNow(Command):
    """Re-read every project file (`reload`), or one (`reload FILE`): the way to reload where saves are not watched
    (`--no-watch`, a network filesystem without file events, an editor's save hook). One file is answered by exactly
    one `reload` event for it, "no code changes" included, so a script knows when it took effect."""

    word: ClassVar[str] = "reload"
    file: str = ""  # relative to the project folder; "" for every file


@dataclass(frozen=True)
class Rollback(Command):
    word: ClassVar[str] = "rollback"


@dataclass(frozen=True)
class RunCleanup(Command):
    word: ClassVar[str] = "cleanup"


@dataclass(frozen=True)
class TakeSnapshot(Command):
    word: ClassVar[str] = "snapshot"


@dataclass(frozen=True)
class RunProfile(Command):
    word: ClassVar[str] = "profile"
    steps: int = 3


@dataclass(frozen=True)
class Evaluate(Command):
    word: ClassVar[str] = "evaluate"


@dataclass(frozen=True)
class Rebuild(Command):
    word: ClassVar[str] = "rebuild"


@dataclass(frozen=True)
class RunStatements(Command):
    word: ClassVar[str] = "run-statements"


@dataclass(frozen=True)
class DumpMemorySnapshot(Command):
    word: ClassVar[str] = "memory-snapshot"


@dataclass(frozen=True)
class ShowBreakdown(Command):
    word: ClassVar[str] = "breakdown"


@dataclass(frozen=True)
class FindLeaks(Command):
    word: ClassVar[str] = "leaks"


@dataclass(frozen=True)
class Interrupt(Command):
    """Raise KeyboardInterrupt inside a running step (a hung data loader, an endless loop)."""

    word: ClassVar[str] = "interrupt"


@dataclass(frozen=True)
class Quit(Command):
    word: ClassVar[str] = "quit"
    final_snapshot: bool = False  # write a snapshot of the state before stopping (signals, "snapshot and quit")
    reason: str = "quit"  # the exit's reason: "requeue signal" (SIGUSR1: snapshot, requeue if asked, exit 0)


COMMANDS: dict[str, type[Command]] = {
    c.word: c
    for c in (
        Pause, Resume, StepOnce, ReloadNow, Rollback, Rebuild, RunStatements, RunCleanup, TakeSnapshot,
        DumpMemorySnapshot, ShowBreakdown, FindLeaks, RunProfile, Evaluate, Interrupt, Quit
    )
}


class CommandError(ValueError):
    """A command line that cannot be understood; the message says what is accepted."""


MAX_PROFILE_STEPS = 100


def _shown(text: str, limit: int = 40) -> str:
    """A word from the input as an error message quotes it: short, whatever its length."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def parse_command(line: str) -> Command:
    """Turn one stdin line (`profile 5`, `pause`, ...) into a command."""
    words = line.split()
    if not words:
        raise CommandError("empty command")
    word, args = words[0].lower(), words[1:]
    kind = COMMANDS.get(word)
    if kind is None:
        raise CommandError(f"unknown command {_shown(word)}; known commands: {', '.join(COMMANDS)}")
    if kind is RunProfile:
        if len(args) > 1:
            raise CommandError("usage: profile [N]  (N = number of steps to profile, 0 cancels a running profile)")
        if args:
            try:
                steps = int(args[0])
            except ValueError:
                raise CommandError(f"profile takes a whole number of steps, not {_shown(args[0])}") from None
            if not 0 <= steps <= MAX_PROFILE_STEPS:
                raise CommandError(
                    f"profile takes 1 to {MAX_PROFILE_STEPS} steps (a trace keeps every op of every step in memory), "
                    "or 0 to cancel a running profile"
                )
            return RunProfile(steps=steps)
        return RunProfile()
    if kind is ReloadNow and args:
        return ReloadNow(file=line.strip().split(maxsplit=1)[1])  # the rest of the line: a path may hold spaces
    if kind is Quit and args:
        if args != ["snapshot"]:
            raise CommandError("usage: quit [snapshot]  (snapshot: write a final snapshot first)")
        return Quit(final_snapshot=True)
    if args:
        raise CommandError(f"{word} takes no arguments")
    return kind()


def command_line(command: Command) -> str:
    """The line `parse_command` reads back as `command`: how a client sends it over a session's socket."""
    if isinstance(command, RunProfile):
        return f"profile {command.steps}"
    if isinstance(command, Quit):
        return "quit snapshot" if command.final_snapshot else "quit"
    if isinstance(command, ReloadNow) and command.file:
        return f"reload {command.file}"
    return command.word
