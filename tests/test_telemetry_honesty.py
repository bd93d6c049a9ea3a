"""Telemetry that does not lie: a stopped process (SIGSTOP) is no slow step; a pause during a long step is said at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import is_event, make_project
from workbench.protocol.events import Pause

TRAIN_PY = """\
import os
import time
import torch


def setup(bench):
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    flag = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow")
    time.sleep(4.0 if os.path.exists(flag) else 0.05)  # the flag file makes one step really slow
    loss = state["model"](torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
"""

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from workbench.engine.project import load_project
    from workbench.engine.session import Session, SessionConfig

    project = load_project(Path(sys.argv[1]))
    config = SessionConfig(device=torch.device("cpu"), watch=False, capture_output=False, sample_memory=False,
                           slow_step_factor=3.0, slow_step_seconds=1.5)
    session = Session(project, config)
    events = session.bus.subscribe()
    session.start()
    while True:
        for event in events.wait(0.2):
            print(event.to_json(), flush=True)
    """
)


def read_events(proc: subprocess.Popen[str], seconds: float) -> list[dict]:
    """The events printed within `seconds` (the driver prints one JSON line each)."""
    import selectors

    found: list[dict] = []
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if selector.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            found.append(json.loads(line))
    return found


def test_a_stopped_process_is_not_reported_as_a_slow_step_and_a_really_slow_one_is(tmp_path) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.Popen([sys.executable, str(driver), str(root / "train.py")], stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        seen = []
        while sum(e["event"] == "step" for e in seen) < 8:
            seen += read_events(proc, 1.0)
            assert proc.poll() is None, "the driver ended"
        os.kill(proc.pid, signal.SIGSTOP)  # a suspended job: 4 s in which no thread runs
        time.sleep(4.0)
        os.kill(proc.pid, signal.SIGCONT)
        after_stop = read_events(proc, 3.0)
        assert sum(e["event"] == "step" for e in after_stop) >= 3, "training did not go on after SIGCONT"
        assert not [e for e in after_stop if e["event"] == "error" and e["where"] == "slow step"], after_stop

        (root / "slow").write_text("")  # now one step really takes 4 s: the watchdog must still say so
        slow = read_events(proc, 4.0)
        (root / "slow").unlink()
        warned = [e for e in slow if e["event"] == "error" and e["where"] == "slow step"]
        assert warned and "press i" in warned[0]["message"], slow
    finally:
        proc.kill()
        proc.wait()


def test_pause_during_a_long_step_is_acknowledged_at_once(start_session) -> None:
    live = start_session({"train.py": TRAIN_PY})
    live.wait_running(2)
    (live.root / "slow").write_text("")
    live.events.steps(1)  # a fast step ended: the next one is the slow one
    time.sleep(1.2)
    sent = time.monotonic()
    live.send(Pause())
    said = live.wait_for(is_event("error", where="pausing"), timeout=2)
    assert time.monotonic() - sent < 1.0 and "pausing after the current step" in said.message and said.is_warning
    (live.root / "slow").unlink()
    live.wait_for(is_event("paused", reason="user"), timeout=10)
