"""The training thread runs at a lower CPU priority in the TUI, so keys reach the screen at once."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading

import pytest

from workbench.cli import nice_increment
from workbench.engine.thread_priority import lower_current_thread

def current_thread_nice() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


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


@pytest.mark.parametrize("text", ["-1", "20", "five"])
def test_out_of_range_nice_is_a_clear_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="between 0|whole number"):
        nice_increment(text)


def test_the_cli_rejects_an_out_of_range_value_before_loading_anything(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(tmp_path / "train.py"), "--training-nice", "20"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "--training-nice" in result.stderr and "between 0 (off) and 19" in result.stderr
