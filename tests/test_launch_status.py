"""The launcher's exit status (workbench/cli/launch.py): what one process would give, where the ranks agree."""

from __future__ import annotations

from types import SimpleNamespace

from workbench.cli.launch import failure_report, job_status


def ended(code: int) -> SimpleNamespace:  # the one field of torchrun's ProcessFailure that is read
    return SimpleNamespace(exitcode=code)


def test_setup_failing_on_one_rank_exits_2_as_one_process_does_and_anything_else_exits_1():
    assert job_status({1: ended(2), 0: ended(-15)}) == 2  # rank 1's setup() failed; torchrun then stopped rank 0
    assert job_status({0: ended(2), 1: ended(2)}) == 2
    assert job_status({0: ended(1), 1: ended(2)}) == 1  # an internal error somewhere: not a user's error
    assert job_status({1: ended(-9)}) == 1  # a rank killed: the job failed, not the user's code
    assert job_status({0: ended(1)}) == 1


def test_the_report_says_how_each_rank_ended():
    report = failure_report({1: ended(2), 0: ended(-15)})
    assert report.startswith("rank 0 was killed by SIGTERM; rank 1 exited with code 2")
