"""The training thread runs at a lower CPU priority in the TUI, so keys reach the screen at once."""

from __future__ import annotations

import argparse
import os
import sys
import threading

import pytest

from workbench.cli import TUI_TRAINING_NICE, nice_increment, training_nice
from workbench.thread_priority import current_thread_nice, lower_current_thread

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def in_thread(body):
    """Run `body` on a fresh thread (nice values only go up without privileges) and return its result."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(body()))
    thread.start()
    thread.join(10)
    return result[0]


@linux_only
def test_lowering_affects_only_the_calling_thread_and_the_threads_it_starts() -> None:
    main_before = current_thread_nice()
    assert main_before is not None

    def body() -> tuple[int | None, int | None, int | None]:
        base = current_thread_nice()
        lowered = lower_current_thread(3)
        child = in_thread(current_thread_nice)
        return base, lowered, child

    base, lowered, child = in_thread(body)
    assert base is not None and lowered == min(base + 3, 19)
    assert child == lowered, "threads started later (torch's pool, DataLoader workers) inherit it"
    assert current_thread_nice() == main_before, "the UI thread keeps its priority"


def test_zero_changes_nothing() -> None:
    assert in_thread(lambda: (lower_current_thread(0), current_thread_nice())) == (None, current_thread_nice())


@linux_only
def test_a_session_lowers_its_training_thread(start_session) -> None:
    live = start_session(training_nice=4)
    live.wait_running()
    worker = live.session.worker
    base = current_thread_nice()
    assert base is not None
    assert worker.nice == min(base + 4, 19)
    assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == worker.nice


def test_the_tui_lowers_it_by_default_and_headless_runs_do_not() -> None:
    assert training_nice(None, headless=False) == TUI_TRAINING_NICE > 0
    assert training_nice(None, headless=True) == 0
    assert training_nice(0, headless=False) == 0
    assert training_nice(7, headless=True) == 7


@pytest.mark.parametrize("text", ["-1", "20", "five"])
def test_out_of_range_nice_is_a_clear_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="between 0|whole number"):
        nice_increment(text)
