"""The default sample project: it learns, and every edit of its README's tour takes effect on save."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.tour import tour_edits
from workbench.protocol.events import Reload, Step
from workbench.engine.project import load_project
from workbench.engine.session import Session, SessionConfig
from tests import conftest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "tiny_gpt"
README = SAMPLE / "README.md"



def copy_sample(tmp_path: Path) -> Path:
    return conftest.copy_sample("tiny_gpt", tmp_path) / "train.py"


def collect_steps(events, count: int, timeout: float = 120.0) -> list[Step]:
    steps: list[Step] = []
    deadline = time.monotonic() + timeout
    while len(steps) < count:
        assert time.monotonic() < deadline, f"only {len(steps)} steps in {timeout} s"
        steps.extend(e for e in events.wait(0.2) if isinstance(e, Step))
    return steps


def wait_reload(events, timeout: float = 30.0) -> Reload:
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the save was not picked up"
        reload = next((e for e in events.wait(0.2) if isinstance(e, Reload)), None)
        if reload is not None:
            return reload


def quoted(reload: Reload) -> None:
    """The README quotes the reload log's headline for this reload (its `RELOAD ...` line, without the timing)."""
    if reload.ok and reload.changed:
        head = f"RELOAD {reload.file} -> code v{reload.code_version}: {', '.join(reload.changed)}"
    elif reload.ok:
        head = f"RELOAD {reload.file}: nothing to apply"
    else:
        head = f"RELOAD FAILED {reload.file}:{reload.line}: {reload.error}"
    assert f"`{head}`" in README.read_text(encoding="utf-8"), f"the README should quote {head!r}"


def test_loss_falls_and_every_tour_edit_applies_to_the_live_model(tmp_path):
    """One session, the README's tour in order: each edit is a real save, checked for the effect the README describes."""
    entry = copy_sample(tmp_path)
    project = entry.parent
    edits = tour_edits(README)
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
        opt = session.worker.user_state["opt"]
        params = list(model.parameters())
        moments = [opt.state[p]["exp_avg"] for p in params]

        def same_model() -> None:
            assert session.worker.user_state["model"] is model and session.worker.user_state["opt"] is opt
            assert all(a is b for a, b in zip(model.parameters(), params, strict=True)), "the model was rebuilt"
            assert all(opt.state[p]["exp_avg"] is m for p, m in zip(params, moments)), "the optimizer state was replaced"

        def lr(edit) -> None:
            step_before = session.status().step
            edit.apply(project)
            reload = wait_reload(events)
            assert reload.ok and reload.file == "train.py" and reload.changed == ("LR",) and reload.code_version == 1, reload
            quoted(reload)
            after = [s for s in collect_steps(events, 3) if s.scalars["lr"] == 3e-4]
            assert after, "steps after the save still use the old LR"
            assert after[0].step > step_before, "the step counter restarted"
            assert opt.param_groups[0]["lr"] == 3e-4
            same_model()

        def attention_scale(edit) -> None:
            edit.apply(project)
            reload = wait_reload(events)
            assert reload.ok and reload.file == "model.py", reload
            assert reload.changed == ("CausalSelfAttention.forward",) and reload.code_version == 2, reload
            quoted(reload)
            attention = type(model.blocks[0].attn)
            assert 0.25 in attention.forward.__code__.co_consts, "the live class does not run the new forward"
            after = collect_steps(events, 3)
            assert all(s.code_version == 2 and s.loss == s.loss and s.loss < 10 for s in after), after
            same_model()

        def ppl_metric(edit) -> None:
            edit.apply(project)
            reload = wait_reload(events)
            assert reload.ok and reload.changed == ("step",) and reload.code_version == 3, reload
            after = [s for s in collect_steps(events, 3) if s.code_version == 3]
            assert after, "no step ran the new code"
            for s in after:
                assert math.isclose(s.scalars["ppl"], math.exp(s.loss), rel_tol=1e-4), s
                assert s.scalars["lr"] == 3e-4, "bench.log scalars are still there"
            same_model()

        def typo(edit) -> None:
            edit.apply(project)
            reload = wait_reload(events)
            assert not reload.ok and reload.file == "train.py" and reload.error == "syntax error: '(' was never closed", reload
            assert reload.line == line_of(entry, "loss.backward("), reload
            quoted(reload)
            after = collect_steps(events, 3)
            assert all(s.code_version == 3 and "ppl" in s.scalars for s in after), "training must go on with the last good code"

        def typo_fixed(edit) -> None:
            edit.apply(project)
            reload = wait_reload(events)
            assert reload.ok and reload.changed == () and reload.code_version == 3, reload
            quoted(reload)
            assert all(s.code_version == 3 for s in collect_steps(events, 3))
            same_model()

        checks = {"lr": lr, "attention-scale": attention_scale, "ppl-metric": ppl_metric, "typo": typo, "typo-fixed": typo_fixed}
        assert [e.name for e in edits] == list(checks)
        for edit in edits:
            checks[edit.name](edit)
    finally:
        session.close()


def line_of(path: Path, needle: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if needle in line)


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
