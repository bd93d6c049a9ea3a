"""A user's own profiler (cProfile, sys.setprofile) inside step() must not hang the session.

On CPython 3.11, cancelling a pending async exception (`PyThreadState_SetAsyncExc(tid, NULL)`) while a
profiler is active in that thread makes the thread's next Python call spin forever with the GIL held.
The worker used to cancel after every step; it now cancels only an interrupt it sent. These run the
session in a child process: the hang holds the GIL, so an in-process test would hang the test runner.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import make_project

REPO = Path(__file__).resolve().parent.parent

PROFILED = """
import cProfile
import pstats
import torch

PROFILER = cProfile.Profile()


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    if bench.step == 3:
        PROFILER.enable()  # a user profiling a few steps from inside the loop
    x = torch.randn(8, 4)
    loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    if bench.step == 8:
        PROFILER.disable()
        calls = pstats.Stats(PROFILER).total_calls
        bench.log(profiled_calls=calls)
    return loss
"""

HANGS_WHILE_PROFILED = """
import cProfile
import time
import torch

PROFILER = cProfile.Profile()


def setup(bench):
    model = torch.nn.Linear(4, 1)
    return {"model": model}


def step(state, bench):
    if bench.step == 2:
        PROFILER.enable()
    while bench.step == 3:  # stuck, with the profiler on: the user presses i
        time.sleep(0.01)
    return state["model"](torch.randn(8, 4)).pow(2).mean()
"""


def _headless(project: Path, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--no-watch", *args],
        cwd=project, stdin=stdin if stdin is not None else subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_step_that_turns_cprofile_on_and_off_runs_on_to_max_steps(tmp_path):
    project = make_project(tmp_path, {"train.py": PROFILED})
    proc = _headless(project, "--max-steps", "12")
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    events = _events(out)
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == list(range(1, 13))
    profiled = [e for e in events if e["event"] == "step" and "profiled_calls" in e["scalars"]]
    assert len(profiled) == 1 and profiled[0]["scalars"]["profiled_calls"] > 0


def test_an_interrupt_lands_in_a_step_running_under_cprofile_and_the_session_goes_on(tmp_path):
    project = make_project(tmp_path, {"train.py": HANGS_WHILE_PROFILED})
    proc = _headless(project, stdin=None)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        events: list[dict] = []
        deadline = time.monotonic() + 120

        def until(pred) -> dict:
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith("{"):
                    events.append(json.loads(line))
                    if pred(events[-1]):
                        return events[-1]
            raise AssertionError(f"not seen; last events: {events[-10:]}; stderr: {proc.stderr.read()[-2000:] if proc.poll() is not None else ''}")

        until(lambda e: e["event"] == "step" and e["step"] == 3)
        time.sleep(0.3)  # step 4 is stuck in its loop
        proc.stdin.write("interrupt\n")
        proc.stdin.flush()
        error = until(lambda e: e["event"] == "error" and e.get("where") == "step")
        assert "interrupted" in error["message"]
        until(lambda e: e["event"] == "paused")
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        exit_event = until(lambda e: e["event"] == "exit")
        assert exit_event["code"] == 0, exit_event
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait(10)
