"""The JSON-lines schema both ways: every event type survives to_json -> event_from_json unchanged.

A new event type without a sample here fails `test_every_event_type_has_a_sample`: the
socket's clients decode every line the session writes, so each type needs a round trip.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from workbench.protocol import events as ev
from workbench.protocol.events import Event, event_from_dict, event_from_json, event_types

T = 1_700_000_000.25  # a fixed event time, so equality covers `time` too

# Every field set to something other than its default, so each field's decoding is exercised.
SAMPLES: dict[str, Event] = {
    e.name: e
    for e in (
        ev.Start(project="/p/train.py", device="cuda:0", version="0.1.0", torch="2.5.1", pid=4242, rank=1, world_size=2,
                 backend="nccl", restart=1, time=T),
        ev.Setup(status="done", seconds=1.5, time=T),
        ev.Step(step=7, loss=2.5, ms=12.25, scalars={"lr": 3e-4, "grad_norm": 1.0}, code_version=2,
                peak_allocated=123_456, gpu=0, saved_bytes=789, rank=1, time=T),
        ev.Evaluation(step=100, scalars={"val_loss": 1.75}, ms=40.5, time=T),
        ev.Reload(ok=False, file="train.py", changed=("step", "LR"), ms=3.5, code_version=3, error="SyntaxError",
                  line=12, notes=("a note",), held=("Model.__init__",), needs_rebuild=("Model built by old code",), time=T),
        ev.Rebuilt(ok=False, seconds=2.5, code_version=4, changed=("setup",), tensors_carried=10, tensors_shared=8,
                   optimizer_states_carried=2, schedulers_carried=1, new=("head.bias",), mismatched=("head.weight",), dropped=("old.w",),
                   error="boom", notes=("n",), time=T),
        ev.Paused(reason="user", step=5, time=T),
        ev.Resumed(reason="reload", step=6, time=T),
        ev.Snapshot(path="/r/snap", bytes=1024, step=9, seconds=0.5, reason="final",
                    left_out=("rank 1: train.ema: its state_dict() holds a train.Opaque, not plain data",), time=T),
        ev.ResumeLoaded(ok=False, path="/r/snap", step=9, tensors=4, optimizers=1, seconds=0.25, missing=("a",),
                        unexpected=("b",), mismatched=("c",), error="bad", notes=("n",), initialized=("d",), mapped=3,
                        late=True, schedulers=2, time=T),
        ev.Cleanup(freed_bytes=2048, before={"rss": 10}, after={"rss": 5}, time=T),
        ev.Profile(status="done", steps=3, trace="/r/trace.json", top_ops=({"name": "aten::mm", "ms": 1.5},), time=T),
        ev.MemorySnapshotTaken(path="/r/mem.pickle", bytes=99, reason="oom", summary=("line",), time=T),
        ev.BreakdownReady(step=3, devices=({"device": "cpu", "parts": [{"name": "weights", "bytes": 10}]},), time=T),
        ev.LeaksFound(step=4, total_bytes=100, unowned_bytes=40, seconds=0.5, groups=({"owner": "model", "bytes": 60},),
                      suspects=({"bytes": 40, "chain": ["a", "b"]},), time=T),
        ev.Memory(rss_bytes=1, rss_anon_bytes=2, rss_file_bytes=3, system_total_bytes=4, system_available_bytes=5,
                  limit_bytes=6, limit_source="cgroup v2 /job", cgroup_usage_bytes=7,
                  gpus=({"index": 0, "name": "H100", "allocated": 8, "power_watts": 300.5},), gpu_note="note",
                  swap_used_bytes=9, time=T),
        ev.Error(where="step", message="it broke", file="train.py", line=3, traceback="Traceback...", time=T),
        ev.Print(stream="stderr", text="hello", time=T),
        ev.CommandSent(client="attach pid 77", command="pause", time=T),
        ev.Ranks(ranks=({"rank": 0, "step": 9, "steps_per_second": 2.5, "loss": 1.25, "step_ms": 400.0, "code_version": 1,
                         "state": "running", "rss_bytes": 1024, "gpu_allocated_bytes": 2048, "gpu_reserved_bytes": 4096},
                        {"rank": 1, "step": 9, "steps_per_second": 2.0, "loss": 1.5, "step_ms": 500.0, "code_version": 1,
                         "state": "paused", "rss_bytes": None, "gpu_allocated_bytes": None, "gpu_reserved_bytes": None}),
                 slowest=1, time=T),
        ev.Exit(reason="quit", step=10, code=2, time=T),
    )
}


def all_event_types() -> dict[str, type[Event]]:
    """Walked here, not taken from events.py, so the test sees what the module defines."""
    found: dict[str, type[Event]] = {}
    pending = list(Event.__subclasses__())
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        assert kind.name not in found, f"two event types share the wire name {kind.name!r}"
        found[kind.name] = kind
    return found


def test_every_event_type_has_a_sample():
    missing = sorted(set(all_event_types()) - set(SAMPLES))
    assert not missing, f"add a sample of each new event type to SAMPLES: {missing}"
    assert set(event_types()) == set(all_event_types())


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(name):
    original = SAMPLES[name]
    line = original.to_json()
    decoded = event_from_json(line)
    assert decoded == original
    assert decoded.to_json() == line
    for f in dataclasses.fields(original):
        assert type(getattr(decoded, f.name)) is type(getattr(original, f.name)), f.name


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_field_of_the_sample_differs_from_its_default(name):
    """Otherwise a field that decodes wrongly could hide behind its default."""
    sample = SAMPLES[name]
    for f in dataclasses.fields(sample):
        if f.name == "time":
            continue
        if f.default is not dataclasses.MISSING:
            assert getattr(sample, f.name) != f.default, f"{name}.{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            assert getattr(sample, f.name) != f.default_factory(), f"{name}.{f.name}"


def test_non_finite_floats_come_back_as_floats():
    step = ev.Step(step=1, loss=math.nan, ms=math.inf, scalars={"lr": -math.inf, "ok": 1.0}, time=T)
    data = json.loads(step.to_json())
    assert data["loss"] == "nan" and data["ms"] == "inf" and data["scalars"]["lr"] == "-inf"
    back = event_from_dict(data)
    assert math.isnan(back.loss) and back.ms == math.inf and back.scalars == {"lr": -math.inf, "ok": 1.0}


def test_whole_numbers_in_float_fields_become_floats():
    back = event_from_dict({"event": "step", "step": 1, "loss": 2, "ms": 3, "scalars": {"lr": 1}})
    assert (back.loss, back.ms, back.scalars["lr"]) == (2.0, 3.0, 1.0)
    assert all(type(v) is float for v in (back.loss, back.ms, back.scalars["lr"]))


def test_unknown_keys_are_ignored_and_defaults_fill_the_rest():
    back = event_from_dict({"event": "paused", "reason": "user", "from_the_future": [1, 2]})
    assert isinstance(back, ev.Paused) and back.reason == "user" and back.step == 0


@pytest.mark.parametrize(
    "data, words",
    [
        ({"event": "teleport"}, "unknown event 'teleport'; known events: breakdown"),
        ({"event": "step", "step": 1, "ms": 2.0}, "event 'step' is missing its 'loss' field"),
        ({"step": 1}, 'no "event" key'),
        ({"event": "step", "step": "one", "loss": 1.0, "ms": 1.0}, "field 'step' should be a whole number"),
        ({"event": "step", "step": 1, "loss": "lots", "ms": 1.0}, "field 'loss' should be a number"),
        ({"event": "reload", "ok": 1, "file": "f"}, "field 'ok' should be true or false"),
        ({"event": "reload", "ok": True, "file": "f", "changed": "step"}, "field 'changed' should be a list"),
        ([1, 2], "an event is a JSON object, not list"),
    ],
)
def test_what_cannot_be_decoded_says_why(data, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        event_from_dict(data)


def test_a_line_that_is_not_json_is_a_value_error():
    with pytest.raises(ValueError, match="not a JSON line"):
        event_from_json("step 1 loss 2")


def test_optional_fields_added_later_stay_off_the_line_while_unset():
    """A CPU step's line is what it was before per-step peaks existed; a reader fills the defaults in."""
    data = json.loads(ev.Step(step=1, loss=1.0, ms=2.0, time=T).to_json())
    assert list(data) == ["event", "time", "step", "loss", "ms", "scalars", "code_version"]
    memory = dataclasses.replace(SAMPLES["memory"], swap_used_bytes=None)
    assert "swap_used_bytes" not in json.loads(memory.to_json()) and event_from_json(memory.to_json()) == memory
    for name, kind in all_event_types().items():
        defaults = {f.name: f.default for f in dataclasses.fields(kind)}
        for field_name in kind.omitted_when_none:
            assert defaults.get(field_name, "missing") is None, f"{name}.{field_name} must be a field whose default is None"


def _generic_json(event: Event) -> str:
    """What every event type's encoder writes: the dict of its fields through json.dumps."""
    return json.dumps(event.to_dict(), allow_nan=False, separators=(",", ":"))


STEP_CASES = [
    dict(step=1, loss=0.1, ms=1.0),
    dict(step=12_345_678, loss=1e-300, ms=5e-324, code_version=7),
    dict(step=3, loss=math.nan, ms=math.inf, scalars={"lr": -math.inf, "acc": 0.5}),
    dict(step=3, loss=-0.0, ms=1e22, scalars={"n": 3}, peak_allocated=2**40, gpu=0),
    dict(step=3, loss=2.0, ms=0.25, saved_bytes=0, rank=7),
    dict(step=3, loss=2.0, ms=0.25, scalars={"ünï": 1.0, 'quote"d': 2.5}, rank=0),
    dict(step=0, loss=1, ms=3, code_version=0),  # ints where floats are declared
    dict(step=5, loss=0.30000000000000004, ms=0.1, scalars={"lr": 3e-4, "grad_norm": 1.5e300}, code_version=2),
    dict(step=5, loss=-0.0, ms=0.1, scalars={"lr": 3e-4, "tokens": 4096}, rank=3),  # an int among the scalars
    dict(step=5, loss=2.5, ms=0.1, scalars={"bad": math.nan}, rank=1),
    dict(step=5, loss=2.5, ms=0.1, scalars={7: 1.0}),  # a key that is not a string
]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_event_type_is_written_as_json_dumps_writes_its_dict(name):
    event = SAMPLES[name]
    assert event.to_json() == _generic_json(event)


@pytest.mark.parametrize("fields", STEP_CASES)
def test_the_step_encoder_writes_what_the_generic_encoder_writes(fields):
    step = ev.Step(**fields, time=T + 0.123456789)
    assert step.to_json() == _generic_json(step)
    assert event_from_json(step.to_json()) == event_from_json(_generic_json(step))


def test_a_step_with_numbers_of_other_types_is_written_as_json_dumps_writes_them():
    class Loss(float):  # a float subclass (as NumPy's float64 is) may repr itself differently
        def __repr__(self) -> str:
            return "Loss(...)"

    step = ev.Step(step=True, loss=Loss(0.5), ms=1.0, time=T)
    assert step.to_json() == _generic_json(step)
    assert '"loss":0.5' in step.to_json() and '"step":true' in step.to_json()


def test_nulls_and_escaped_strings_are_written_as_json_dumps_writes_them():
    error = ev.Error(where="step", message='caf\u00e9 "quoted"\n\ttab \\ back', time=T)  # file, line, traceback: None
    assert error.to_json() == _generic_json(error)
    assert '"file":null' in error.to_json()


def test_a_quick_step_is_the_step_the_dataclass_makes():
    """Step.quick sets the fields itself: a field added to Step and not to quick() fails here (and the sample's
    fields all differ from their defaults, so a field quick() swapped or dropped fails too)."""
    made = SAMPLES["step"]
    assert isinstance(made, ev.Step)
    quick = ev.Step.quick(made.step, made.loss, made.ms, made.scalars, made.code_version,
                          peak_allocated=made.peak_allocated, gpu=made.gpu, saved_bytes=made.saved_bytes, rank=made.rank,
                          time=made.time)
    assert set(vars(quick)) == {f.name for f in dataclasses.fields(ev.Step)}
    assert quick == made and quick.to_json() == made.to_json()
    plain = ev.Step.quick(3, 0.5, 1.0, {}, 0)
    assert plain == ev.Step(step=3, loss=0.5, ms=1.0, time=plain.time) and plain.to_json() == json.dumps(
        plain.to_dict(), separators=(",", ":"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.loss = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("command", [ev.ReloadNow(), ev.ReloadNow(file="model.py"), ev.ReloadNow(file="my models/gpt.py"),
                                     ev.RunProfile(steps=5), ev.Quit(final_snapshot=True), ev.Quit(), ev.Pause()])
def test_a_command_crosses_a_socket_as_the_line_that_reads_back_as_it(command) -> None:
    assert ev.parse_command(ev.command_line(command)) == command
