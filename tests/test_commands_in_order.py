"""Commands sent together run in the order sent, each `step` before the commands after it.

A script drives a paused session with `step` lines; sent in one write, they reached the training thread as one batch,
and the batch set one flag: `step`, `step`, `step` ran one step, and `step`, `quit` none at all, with no event saying
so. Each `step` now runs before the next command is taken, in one process and on every rank under torchrun.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_distributed import PROJECT, project_folder, rank_log, steps_of
from tests.test_headless import Headless


def steps_sent_at_once(run: Headless, lines: list[str]) -> None:
    """The lines in one write (one batch for the training thread), as a script piping commands would send them."""
    run.send("\n".join(lines))


def sent_then_input_closed(run: Headless, lines: list[str], ends: str) -> None:
    """Once the paused run is up, the lines in one write, then the end of input (a driver script that is done); the
    run ends by itself, for the reason `ends`."""
    try:
        run.wait_event("paused", timeout=90)
        steps_sent_at_once(run, lines)
        assert run.proc.stdin is not None
        run.proc.stdin.close()
        assert run.finish(timeout=90) == 0, run.explain()
        assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == ends, run.events[-1]
    finally:
        run.close()


def test_steps_sent_at_once_each_run_and_a_quit_after_them_comes_last(tmp_path: Path) -> None:
    run = Headless(project_folder(tmp_path) / "train.py", "--paused", "--", "--no-ddp")
    try:
        run.wait_event("paused", timeout=60)
        steps_sent_at_once(run, ["step", "step", "step", "snapshot", "step", "quit"])
        assert run.finish(timeout=60) == 0, run.explain()
        steps = [e["step"] for e in run.events if e["event"] == "step"]
        assert steps == [1, 2, 3, 4], run.explain()
        snapshot = next(e for e in run.events if e["event"] == "snapshot")
        assert snapshot["step"] == 3, snapshot  # taken after the third step, before the fourth
        assert run.events[-1]["event"] == "exit" and run.events[-1]["step"] == 4
        assert not [e for e in run.events if e["event"] == "error"], run.explain()
    finally:
        run.close()


def test_steps_sent_at_once_run_on_every_rank_in_the_order_sent(tmp_path: Path) -> None:
    run = Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", "--paused")
    try:
        run.wait_event("paused", timeout=90)
        steps_sent_at_once(run, ["step", "step", "snapshot", "step", "quit"])
        assert run.finish(timeout=90) == 0, run.explain()
        assert sorted(steps_of(run.events, 0)) == [1, 2, 3], run.explain()
        assert sorted(steps_of(rank_log(run), 1)) == [1, 2, 3]
        snapshot = next(e for e in run.events if e["event"] == "snapshot")
        assert snapshot["step"] == 2, snapshot
        assert run.events[-1]["event"] == "exit" and run.events[-1]["step"] == 3
    finally:
        run.close()
    (folder,) = (run.entry.parent / ".vram-bench" / "runs").iterdir()
    logs = sorted(path.name for path in folder.glob("events*.jsonl"))
    assert logs == ["events-rank1.jsonl", "events.jsonl"], logs  # rank 0's is events.jsonl, headless too


def test_closing_stdin_while_paused_ends_every_rank_with_a_final_snapshot(tmp_path: Path) -> None:
    """Under torchrun, a launcher whose driver died left the launcher and its ranks paused for ever."""
    run = Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", "--paused")
    try:
        run.wait_event("paused", timeout=90)
        steps_sent_at_once(run, ["step"])
        run.wait_for(lambda e: e["event"] == "step" and e.get("rank") == 0, timeout=30, what="step 1")
        assert run.proc.stdin is not None
        run.proc.stdin.close()
        snapshot = run.wait_event("snapshot", timeout=60)
        assert snapshot["step"] == 1, snapshot
        assert run.finish(timeout=90) == 0, run.explain()
        assert run.events[-1]["event"] == "exit" and run.events[-1]["reason"] == "input closed", run.events[-1]
        assert [e["reason"] for e in rank_log(run) if e["event"] == "exit"] == ["input closed"]
    finally:
        run.close()


RANK_1_DATA_FAILS = """
import torch
from torch import nn


def batches(rank):
    n = 0
    while True:
        n += 1
        if rank == 1 and n == 1:
            raise ValueError("rank 1's data failed")
        yield torch.randn(4, 8)


def setup(bench):
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "batches": batches(bench.rank)}


def step(state, bench):
    loss = state["model"](next(state["batches"])).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss
"""


def test_a_resume_sent_with_a_step_that_fails_on_one_rank_comes_after_that_failure_on_every_rank(
        tmp_path: Path) -> None:
    """The `resume` a `step` held back ran before the exchange that said rank 1's step had failed: rank 1 rebuilt (its
    generator ended) and rank 0 resumed, and their next collectives did not pair (gloo aborted the run). It waits for
    that exchange now: every rank pauses for the failure, then every rank rebuilds and resumes (a review's finding)."""
    run = Headless(project_folder(tmp_path, RANK_1_DATA_FAILS) / "train.py", "--nproc-per-node", "2", "--paused",
                   "--no-watch")
    try:
        run.wait_event("paused", timeout=90)
        steps_sent_at_once(run, ["step", "resume"])
        run.wait_event("paused", timeout=30, reason="error")
        rebuilt = run.wait_event("rebuild", timeout=60)
        assert rebuilt["ok"], rebuilt
        run.wait_event("resumed", timeout=30, reason="rebuild")
        run.wait_event("paused", timeout=30, reason="error")  # the rebuilt generator fails on rank 1 again
        run.send("quit")
        assert run.finish(timeout=60) == 0, run.explain()
    finally:
        run.close()
    ones = [e for e in rank_log(run) if e["event"] in ("rebuild", "resumed")]
    assert [e["event"] for e in ones] == ["rebuild", "resumed"], ones  # rank 1 rebuilt with rank 0, once
    assert not [e for e in run.events if e["event"] == "exit" and e["reason"] == "rank lost"]


def test_input_closed_after_a_resume_comes_after_it_on_every_rank(tmp_path: Path) -> None:
    """The end of input ran on rank 0 at once, before the `resume` sent before it had reached the ranks: the run
    ended at its pause (`input closed`) instead of training to --max-steps (a review's finding)."""
    run = Headless(project_folder(tmp_path) / "train.py", "--nproc-per-node", "2", "--paused", "--max-steps", "30")
    sent_then_input_closed(run, ["resume"], ends="max steps")
    assert max(steps_of(run.events, 0)) == 30


PLAIN_EVALUATE = '''

def evaluate(state, bench):
    return {"val": 1.0}
'''


def test_input_closed_after_the_last_step_leaves_its_due_evaluation_to_run_first(tmp_path: Path) -> None:
    """`step` then the end of input at --max-steps 1 --eval-every 1: the step's evaluation, a command queued after it,
    was skipped, and the run ended `input closed` (a review's finding). It runs on every rank, then the run ends as
    --max-steps says."""
    project = project_folder(tmp_path, PROJECT + PLAIN_EVALUATE)
    run = Headless(project / "train.py", "--nproc-per-node", "2", "--paused", "--max-steps", "1", "--eval-every", "1")
    sent_then_input_closed(run, ["step"], ends="max steps")
    assert [e["scalars"] for e in run.events if e["event"] == "evaluate"] == [{"val": 1.0}], run.explain()
