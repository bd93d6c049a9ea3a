"""The batchnorm_cnn sample: it learns, and every edit of its README's tour has the effect the README describes.

One real session trains a copy of the sample and makes the tour's edits in
order (read from the README by `tests/tour.py`, so the text and this test
cannot drift apart), each as a real save, pressing `e` where the tour says so.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Live, is_event
from tests.tour import TourEdit, tour_edits
from workbench.protocol.events import Evaluate, Reload, Step

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "batchnorm_cnn"
README = SAMPLE / "README.md"
WARMUP_STEPS = 30  # the tour says to let it train first: bn_var has moved away from 1.0 by then


def is_eval_warning(event) -> bool:
    return event.name == "error" and event.where == "eval mode"


def test_twenty_headless_steps_with_a_finite_falling_loss(tmp_path):
    project = tmp_path / "batchnorm_cnn"
    shutil.copytree(SAMPLE, project, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--max-steps", "20", "--no-watch"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 21))
    losses = [s["loss"] for s in steps]
    assert all(isinstance(x, float) and math.isfinite(x) for x in losses), losses
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.2, f"the loss did not fall: {first:.3f} -> {last:.3f} ({losses})"
    assert all(s["scalars"]["train_mode"] == 1 and s["scalars"]["bn_batches"] == s["step"] for s in steps)
    assert not [e for e in events if e["event"] == "error"], [e for e in events if e["event"] == "error"]


# --------------------------------------------------------------------------- the tour, edit by edit


def check_max_pool(live: Live, reload: Reload, before: Step) -> None:
    """(a) forward changes on the live model; bn_batches keeps counting, bn_var keeps its value, train_mode 1."""
    assert reload.changed == ("SmallCNN.forward",), reload
    after = live.events.steps(3, lambda e: e.code_version == reload.code_version)
    for step in after:
        assert step.scalars["bn_batches"] == step.step, "the BatchNorm batch counter was reset"
        assert step.scalars["train_mode"] == 1.0
    assert after[0].step > before.step
    drift = abs(after[0].scalars["bn_var"] - before.scalars["bn_var"])
    assert drift < 0.25 * before.scalars["bn_var"], f"bn_var jumped: {before.scalars} -> {after[0].scalars}"
    assert abs(after[0].scalars["bn_var"] - 1.0) > 0.2, "bn_var is back at its initial 1.0"


def check_forget_train(live: Live, reload: Reload, before: Step) -> None:
    """(b) press e: one warning naming state["model"]; train_mode 0, bn_batches frozen, Dropout off, not paused."""
    assert reload.changed == ("evaluate",), reload
    live.send(Evaluate())  # the tour: "press e"
    evaluation = live.wait_for(is_event("evaluate"))
    warning = live.wait_for(is_eval_warning, what="the eval-mode warning")
    assert 'state["model"]' in warning.message and 'state["model"].train()' in warning.message
    after = live.events.steps(5)
    assert all(s.scalars["train_mode"] == 0.0 for s in after)
    assert all(s.scalars["bn_batches"] == evaluation.step for s in after), "eval-mode BatchNorm must not count batches"
    assert len({s.scalars["bn_var"] for s in after}) == 1, "eval-mode BatchNorm must not update running_var"
    model = live.session.worker.user_state["model"]
    assert not model.training and not model.dropout.training
    assert len([e for e in live.events.of("error") if is_eval_warning(e)]) == 1, "warned once, not every step"
    assert not live.events.of("paused")


def check_fix_train(live: Live, reload: Reload, before: Step) -> None:
    """(c) the save alone leaves the model in eval mode; pressing e again switches it back; no new warning."""
    assert reload.changed == ("evaluate",), reload
    still = live.events.steps(2, lambda e: e.code_version == reload.code_version)
    assert all(s.scalars["train_mode"] == 0.0 for s in still), "the mode belongs to the live model: a save keeps it"
    frozen = still[-1].scalars["bn_batches"]
    live.send(Evaluate())  # the tour: "press e again"
    evaluation = live.wait_for(is_event("evaluate"))
    after = live.events.steps(3)
    assert all(s.scalars["train_mode"] == 1.0 for s in after)
    assert [s.scalars["bn_batches"] for s in after] == [frozen + i for i in (1, 2, 3)], "bn_batches counts again"
    assert after[0].step == evaluation.step + 1
    assert len([e for e in live.events.of("error") if is_eval_warning(e)]) == 1, "no new warning"
    assert not live.events.of("paused")


CHECKS: dict[str, Callable[[Live, Reload, Step], None]] = {
    "max-pool": check_max_pool,
    "forget-train": check_forget_train,
    "fix-train": check_fix_train,
}


def test_every_tour_edit_has_the_effect_the_readme_describes(start_session):
    edits: list[TourEdit] = tour_edits(README)
    assert [e.name for e in edits] == list(CHECKS), "the README's tour and this test must list the same edits"
    live = start_session({path.name: path.read_text(encoding="utf-8") for path in SAMPLE.glob("*.py")})
    live.wait_for(is_event("setup", status="done"), timeout=60)
    live.events.steps(WARMUP_STEPS, timeout=60)
    model = live.session.worker.user_state["model"]

    for version, edit in enumerate(edits, start=1):
        before = live.events.steps(1, timeout=30)[0]
        edit.apply(live.root)
        reload = live.wait_for(is_event("reload", code_version=version), timeout=30, what=f"the reload of {edit.name}")
        assert reload.ok and not reload.needs_rebuild, reload
        CHECKS[edit.name](live, reload, before)

    assert live.session.worker.user_state["model"] is model, "the model was never rebuilt"


def test_the_readme_names_every_row_the_step_logs():
    readme = README.read_text(encoding="utf-8")
    source = (SAMPLE / "train.py").read_text(encoding="utf-8")
    for row in ("train_mode", "bn_batches", "bn_var"):
        assert f"{row}=" in source and f"`{row}`" in readme, row
    assert "WARNING eval mode" in readme
