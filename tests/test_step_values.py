"""A step's loss is read without waiting for the device: a step late when its copy is still on the way, never lost,
never out of order, and always before a command, a pause or the exit (workbench/engine/step_values.py).

The device is the pretend one of tests/pretend_device.py (this machine has no GPU); the worker, the session and
the events are real. `pytest -m cuda` runs the same promise on a real GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from tests import pretend_device
from tests.conftest import is_event
from workbench.engine import step_values
from workbench.engine.step_values import StepOutputError, start_reading
from workbench.protocol.events import Pause, Resume

PROJECT = """
import math
import time
from tests.pretend_device import DEVICE


def setup(bench):
    return {"i": 0}


def step(state, bench):
    state["i"] += 1
    i = state["i"]
    time.sleep(SLEEP)
    if i == FAIL_AT:
        DEVICE.fail_next_wait = True
    bench.log(lr=DEVICE.scalar(100 + i))
    return DEVICE.scalar(math.nan if i == NAN_AT else 1 / i)
"""


def project(sleep: float = 0.0, nan_at: int = -1, fail_at: int = -1) -> dict[str, str]:
    return {"train.py": f"SLEEP = {sleep}\nNAN_AT = {nan_at}\nFAIL_AT = {fail_at}\n" + PROJECT}


@pytest.fixture(autouse=True)
def pretend_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[pretend_device.PretendDevice]:
    device = pretend_device.PretendDevice()
    monkeypatch.setattr(pretend_device, "DEVICE", device)
    monkeypatch.setattr(step_values, "READERS", [*step_values.READERS, pretend_device.READER])
    yield device


def steps_before(live, kind: str) -> tuple[list, object]:  # type: ignore[no-untyped-def]
    """The step events seen before the first `kind` event, and that event."""
    seen = live.events.seen
    index = next(i for i, e in enumerate(seen) if e.name == kind)
    return [e for e in seen[:index] if e.name == "step"], seen[index]


def test_each_loss_is_read_after_the_next_step_is_queued_and_every_step_is_reported_before_the_pause(
        start_session, pretend_gpu):
    live = start_session(project(), max_steps=6, exit_at_max_steps=False)
    live.wait_for(is_event("paused", reason="max steps"), timeout=30)
    steps, _ = steps_before(live, "paused")
    assert [e.step for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e.loss for e in steps] == [1 / i for i in range(1, 7)]
    assert [e.scalars["lr"] for e in steps] == [100 + i for i in range(1, 7)]
    journal = pretend_gpu.journal
    for i in range(1, 6):  # step i's loss was read only once step i+1's had been copied: the device was never waited on
        assert journal.index(("read", 1 / i)) > journal.index(("copy", 1 / (i + 1))), journal
    assert ("read", 1 / 6) in journal, "the last step's loss is read before the pause"


def test_a_late_steps_time_is_the_pace_of_its_values_not_the_two_steps_it_waited_across(start_session):
    live = start_session(project(sleep=0.02), max_steps=9, exit_at_max_steps=False)
    live.wait_for(is_event("paused", reason="max steps"), timeout=30)
    times = sorted(e.ms for e in live.events.of("step")[1:])
    assert 18 <= times[len(times) // 2] < 32, times  # one step's sleep; start-to-read would be two


def test_a_copy_already_done_is_read_at_once(start_session, pretend_gpu):
    pretend_gpu.ready = True
    live = start_session(project(), max_steps=4, exit_at_max_steps=False)
    live.wait_for(is_event("paused", reason="max steps"), timeout=30)
    journal = pretend_gpu.journal
    for i in range(1, 4):
        assert journal.index(("read", 1 / i)) < journal.index(("copy", 1 / (i + 1))), journal
    assert [e.loss for e in live.events.of("step")] == [1, 1 / 2, 1 / 3, 1 / 4]


def test_a_pause_command_comes_after_every_step_it_stops(start_session):
    live = start_session(project(sleep=0.01))
    live.wait_running(steps=5)
    live.send(Pause())
    paused = live.wait_for(is_event("paused"), timeout=10)
    steps, _ = steps_before(live, "paused")
    assert [e.step for e in steps] == list(range(1, paused.step + 1))  # none missing, none after the pause


def test_a_nan_read_a_step_late_pauses_and_names_its_own_step(start_session):
    live = start_session(project(nan_at=3))
    error = live.wait_for(is_event("error", where="step"), timeout=30)
    paused = live.wait_for(is_event("paused", reason="non-finite loss"), timeout=10)
    assert "loss is nan at step 3" in error.message and "read after step 4 was queued" in error.message, error.message
    assert paused.step == 4
    steps, _ = steps_before(live, "paused")
    assert [e.step for e in steps] == [1, 2, 3, 4] and math.isnan(steps[2].loss)


def test_a_device_error_met_when_reading_a_loss_pauses_like_a_failed_step_and_training_goes_on(start_session):
    live = start_session(project(sleep=0.005, fail_at=3))
    error = live.wait_for(is_event("error", where="step"), timeout=30)
    assert "illegal memory access" in error.message
    # The pretend device fails the first wait after step 3 was queued: the read of step 2's loss, a step late.
    assert error.message.startswith("reading step 2's loss from the device raised RuntimeError"), error.message
    paused = live.wait_for(is_event("paused"), timeout=10)
    live.send(Resume())
    later = live.events.steps(3)
    assert later[-1].step > paused.step  # the same state trains on: nothing was rebuilt or lost
    assert live.session.worker.user_state["i"] >= later[-1].step


def test_values_that_are_no_loss_are_refused_at_once_wherever_they_live():
    with pytest.raises(StepOutputError, match="returned None"):
        start_reading(None, {})
    with pytest.raises(StepOutputError, match="without a 'loss' key"):
        start_reading({"acc": 1.0}, {})
    with pytest.raises(StepOutputError, match="tensor of shape"):
        start_reading({"loss": 1.0, "acc": torch.ones(2)}, {})
    values = start_reading({"loss": torch.tensor(2.5), "acc": 1}, {"lr": 0.5})
    assert values.reader is None and values.read() == (2.5, {"acc": 1.0, "lr": 0.5})  # host values: read at once


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_loss_is_copied_without_waiting_and_reads_the_right_value():
    x = torch.full((1024, 1024), 2.0, device="cuda")
    loss = (x @ x).mean()  # 4096.0, queued
    values = start_reading(loss, {"lr": torch.tensor(0.25, device="cuda")})
    assert values.reader is step_values.CUDA_READER
    assert values.read() == (4096.0, {"lr": 0.25})


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_values_on_two_gpus_wait_for_both_copies():
    x = torch.full((2048, 2048), 1.0, device="cuda:1")
    values = start_reading(torch.tensor(1.5, device="cuda:0"), {"far": (x @ x).mean()})  # 2048.0, queued on cuda:1
    assert len(values.mark) == 2
    assert values.read() == (1.5, {"far": 2048.0})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_logged_cuda_value_changed_in_place_afterwards_is_read_as_it_was_when_logged(tmp_path):
    from workbench.engine.bench import Bench

    bench = Bench(torch.device("cuda"), tmp_path)
    norm = torch.tensor(3.0, device="cuda")
    bench.log(grad_norm=norm)
    norm.zero_()  # the user's code goes on with the same tensor
    values = start_reading(torch.tensor(1.0, device="cuda"), bench._take_logged())
    assert values.read() == (1.0, {"grad_norm": 3.0})
