"""The default sample project: it learns, and the README's first edit takes effect on save."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from workbench.events import Reload, Step
from workbench.project import load_project
from workbench.session import Session, SessionConfig

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "tiny_gpt"


def copy_sample(tmp_path: Path) -> Path:
    target = tmp_path / "tiny_gpt"
    shutil.copytree(SAMPLE, target, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    return target / "train.py"


def collect_steps(events, count: int, timeout: float = 120.0) -> list[Step]:
    steps: list[Step] = []
    deadline = time.monotonic() + timeout
    while len(steps) < count:
        assert time.monotonic() < deadline, f"only {len(steps)} steps in {timeout} s"
        steps.extend(e for e in events.wait(0.2) if isinstance(e, Step))
    return steps


def test_loss_falls_and_lr_edit_applies_without_losing_the_step_count(tmp_path):
    entry = copy_sample(tmp_path)
    session = Session(load_project(entry), SessionConfig(device=torch.device("cpu"), memory_event_interval=0))
    events = session.bus.subscribe()
    session.start()
    try:
        assert session.wait_until_watching()
        steps = collect_steps(events, 80)
        first, last = steps[0].loss, sum(s.loss for s in steps[-10:]) / 10
        assert all(s.loss == s.loss and s.loss < 10 for s in steps), "loss must stay finite"
        assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
        assert steps[-1].scalars["lr"] == 3e-3
        model = session.worker.user_state["model"]
        weight = next(model.parameters())
        step_before = session.status().step

        # The README's first edit: change LR and save.
        source = entry.read_text()
        assert "LR = 3e-3" in source
        entry.write_text(source.replace("LR = 3e-3", "LR = 3e-4", 1))

        reload = None
        deadline = time.monotonic() + 30
        while reload is None:
            assert time.monotonic() < deadline, "the LR edit was not applied"
            reload = next((e for e in events.wait(0.2) if isinstance(e, Reload)), None)
        assert reload.ok and reload.changed == ("LR",), reload
        after = [s for s in collect_steps(events, 5) if s.scalars["lr"] == 3e-4]
        assert after, "steps after the save still use the old LR"
        assert after[0].step > step_before, "the step counter restarted"
        assert session.worker.user_state["model"] is model
        assert next(model.parameters()) is weight
        assert session.worker.user_state["opt"].param_groups[0]["lr"] == 3e-4
    finally:
        session.close()


def test_vram_bench_without_arguments_runs_the_default_sample():
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "--headless", "--max-steps", "3", "--no-watch"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[0]["event"] == "start" and events[0]["project"] == "tiny_gpt/train.py"
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]
    assert events[-1] == {**events[-1], "event": "exit", "reason": "max steps", "code": 0}
