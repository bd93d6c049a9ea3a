"""What a rank sends at an exchange: its commands as JSON, its trained steps as numbers (workbench/engine/lockstep.py)."""

from __future__ import annotations

import math
from array import array

import pytest

from workbench.engine.lockstep import STEP_FIELDS, TurnPeriod, pack_payload, unpack_payload


def test_nothing_to_say_is_no_bytes() -> None:
    assert pack_payload([], array("d")) == b""
    assert unpack_payload(b"") == ([], [])


def test_commands_and_steps_come_back_as_sent() -> None:
    steps = array("d", [7, 0.25, 2.5, 3, 1.7e9, 8, float("nan"), 2.0, 3, 1.7e9 + 1])
    commands = [{"type": "Pause", "fields": {}}, {"type": "AgreedSource", "fields": {"path": "m.py", "source": "x = 'é'\n"}}]
    got_commands, got_steps = unpack_payload(pack_payload(commands, steps))
    assert got_commands == commands
    assert len(got_steps) == 2 and all(len(row) == STEP_FIELDS for row in got_steps)
    assert got_steps[0] == (7.0, 0.25, 2.5, 3.0, 1.7e9)
    assert got_steps[1][0] == 8.0 and math.isnan(got_steps[1][1])  # a non-finite loss crosses as it is


def test_only_commands_or_only_steps() -> None:
    assert unpack_payload(pack_payload([{"type": "Resume", "fields": {}}], array("d"))) == ([{"type": "Resume", "fields": {}}], [])
    assert unpack_payload(pack_payload([], array("d", [1, 2, 3, 4, 5]))) == ([], [(1.0, 2.0, 3.0, 4.0, 5.0)])


def test_a_turn_is_timed_from_turns_and_time_between_exchanges() -> None:
    """The cadence aims at EXCHANGE_SECONDS of wall time: a turn is the step plus all around it, not the step alone."""
    period = TurnPeriod()
    period.note(0, 10.0, running=True)
    assert period.seconds is None  # one exchange is not a period yet
    period.note(25, 10.05, running=True)
    assert period.seconds == pytest.approx(0.002)
    period.note(50, 10.15, running=True)  # turns slowed to 4 ms: the estimate moves halfway at once
    assert period.seconds == pytest.approx(0.003)


def test_a_pause_starts_the_turn_count_afresh() -> None:
    """Paused turns wait for commands (tenths of a second each): they must not count as training turns."""
    period = TurnPeriod()
    period.note(0, 0.0, running=True)
    period.note(10, 0.01, running=True)
    period.note(11, 5.0, running=False)
    period.note(12, 5.1, running=True)
    assert period.seconds == pytest.approx(0.001)
    period.note(22, 5.12, running=True)
    assert period.seconds == pytest.approx(0.0015)
