"""The lora_finetune sample: it learns headless, and its README's tour does what the README says.

The tour's edits are read from the README (tests/tour.py), made in order as
real saves in one live session on a copy of the sample, and each is checked
against what the README describes: a held reload, a rebuild report, the loss,
the chart rows. The breakdown figures the README quotes are checked against
the `breakdown` command's event, and the README must quote exactly those.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Live, is_event, open_session
from tests.tour import TourEdit, tour_edits
from workbench.protocol.events import BreakdownReady, Event, Rebuild, ShowBreakdown, Step
from workbench.units import human_bytes
from tests import conftest

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_projects" / "lora_finetune"
README = SAMPLE / "README.md"

PLATEAU = slice(250, 300)  # the steps (of one phase) whose mean loss is compared across ranks
BASE_ELEMENTS = 38_538  # fc1, fc2, fc3 and head of the 32-128-128-128-10 MLP, weights and biases
FLOAT = 4


def copy_sample(tmp_path: Path) -> Path:
    return conftest.copy_sample("lora_finetune", tmp_path)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)




def test_twenty_headless_steps_have_a_finite_falling_loss(tmp_path: Path) -> None:
    project = copy_sample(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--max-steps", "20", "--no-watch"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    printed = [e["text"] for e in events if e["event"] == "print"]
    assert any(t.startswith("pretrained the base on task A: 300 steps") for t in printed), printed
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 21))
    losses = [e["loss"] for e in steps]
    assert all(isinstance(x, float) and math.isfinite(x) for x in losses), losses
    assert losses[0] > 3.0, "the frozen base should start far off on task B"
    assert mean(losses[-5:]) < mean(losses[:5]) - 0.5, losses
    assert steps[-1]["scalars"] == {"lr": 0.01, "rank": 4.0, "trainable_params": 640.0, "frozen_params": float(BASE_ELEMENTS)}
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "max steps" and events[-1]["code"] == 0


# --------------------------------------------------------------------------- the tour


def breakdown(live: Live) -> dict:
    """The `b` key's report for the cpu device, as the headless protocol writes it."""
    live.send(ShowBreakdown())
    event = live.wait_for(is_event("breakdown"), timeout=30)
    assert isinstance(event, BreakdownReady)
    (device,) = event.devices
    assert device["device"] == "cpu"
    return device


def check_breakdown(device: dict, adapter_elements: int, adapter_tensors: int, readme: str) -> None:
    """The figures README's breakdown tables quote: frozen weights hold no gradients or optimizer state."""
    parts = {p["name"]: p for p in device["parts"]}
    frozen = BASE_ELEMENTS * FLOAT
    trainable = adapter_elements * FLOAT
    assert device["frozen_parameter_bytes"] == frozen
    assert parts["parameters"]["bytes"] == frozen + trainable
    assert parts["gradients"]["bytes"] == trainable, "only the adapters hold gradients"
    assert parts["optimizer state"]["bytes"] == 2 * trainable + FLOAT * adapter_tensors, "AdamW state for the adapters only"
    assert parts["buffers"]["bytes"] == 0
    # On CPU the activations row holds what autograd saved for backward in a measured step, labelled so.
    assert parts["activations"]["label"].startswith("saved for backward") and parts["activations"]["bytes"] > 0
    assert parts["cache / fragmentation"]["bytes"] is None
    assert any("of parameters are frozen (150.54 KiB): they need no gradients or optimizer state" in a for a in device["advice"])
    # What the README's table shows, row by row.
    for name in ("parameters", "gradients", "optimizer state", "buffers"):
        row = f"| {name} | {human_bytes(parts[name]['bytes'])} | {parts[name]['detail']} |"
        assert row in readme, f"README should show {row!r}"
    assert f"frozen parameters: {human_bytes(frozen)}" in readme


class Tour:
    """One live session on a copy of the sample, with the step losses of each phase of the tour."""

    def __init__(self, live: Live, readme: str) -> None:
        self.live = live
        self.readme = readme
        self.first_step: Step | None = None
        self.plateaus: list[float] = []

    def run_phase(self, code_version: int, count: int = PLATEAU.stop) -> list[Step]:
        steps = self.live.events.steps(count, lambda e: e.code_version == code_version, timeout=120)
        if len(steps) >= PLATEAU.stop:
            self.plateaus.append(mean([e.loss for e in steps[PLATEAU]]))
        return steps

    def held_then_rebuilt(self, edit: TourEdit, code_version: int) -> Event:
        """Save the edit: it is held as needing a rebuild; the rank-4 code keeps training; R rebuilds."""
        edit.apply(self.live.root)
        held = self.live.wait_for(is_event("reload", file="train.py"), timeout=30)
        assert held.ok and held.changed == () and held.held == ("setup",), held
        assert held.needs_rebuild == ("setup() changed: the live state was built by the old setup()",)
        assert self.live.session.status().needs_rebuild == ("train.py",)
        assert "setup() changed: the live state was built by the old setup()" in self.readme
        kept = self.live.events.steps(2)
        assert all(e.code_version == code_version - 1 for e in kept), "a held edit must not change the running code"
        self.live.send(Rebuild())
        rebuilt = self.live.wait_for(is_event("rebuild"), timeout=60)
        assert rebuilt.ok and rebuilt.changed == ("setup",) and rebuilt.code_version == code_version, rebuilt
        assert self.live.session.status().needs_rebuild == ()
        return rebuilt

    def check_rank(self, edit: TourEdit) -> None:
        """Section 2: rank 4 -> 8. The base is carried; the adapters change shape and start fresh."""
        rebuilt = self.held_then_rebuilt(edit, code_version=1)
        assert rebuilt.tensors_carried == 8 and rebuilt.optimizer_states_carried == 0, rebuilt
        mismatched = ("model.fc1.lora_A (4, 32) -> (8, 32)", "model.fc1.lora_B (128, 4) -> (128, 8)")
        assert rebuilt.mismatched == mismatched and rebuilt.new == () and rebuilt.dropped == (), rebuilt
        assert "carried 8 tensors (8 handed over without a copy) and 0 optimizer states" in self.readme
        assert "shape changed: " + ", ".join(mismatched) in self.readme
        printed = [e.text for e in self.live.events.of("print")]
        assert "reusing the base pretrained earlier in this session" in printed, "a rebuild should not pretrain again"
        steps = self.run_phase(code_version=1)
        assert steps[0].scalars == {"lr": 0.01, "rank": 8.0, "trainable_params": 1280.0, "frozen_params": float(BASE_ELEMENTS)}
        # Fresh adapters compute nothing (lora_B == 0): the plain base again, on the next batch (the rows' stream is
        # carried over), so about the session's first loss, far above the rank-4 plateau.
        assert self.first_step is not None and steps[0].step > self.first_step.step
        assert steps[0].loss == pytest.approx(self.first_step.loss, rel=0.25), (steps[0].loss, self.first_step.loss)
        assert f"jumps back up** to\nwhere the session began ({self.first_step.loss:.2f} on its first batch)" in self.readme
        rank4, rank8 = self.plateaus
        assert 0.6 < rank4 < 0.8 and 0.45 < rank8 < 0.62, self.plateaus  # README: around 0.7, around 0.55
        assert rank8 < rank4 - 0.08, f"rank 8 should level off below rank 4: {self.plateaus}"

    def check_targets(self, edit: TourEdit) -> None:
        """Section 3: adapters on fc2 and fc3 too. fc1's adapter and its AdamW state carry; the loss does not jump."""
        before = self.live.events.steps(1, lambda e: e.code_version == 1)[0]
        rebuilt = self.held_then_rebuilt(edit, code_version=2)
        assert rebuilt.tensors_carried == 10 and rebuilt.optimizer_states_carried == 2, rebuilt
        new = ("model.fc2.lora_A", "model.fc2.lora_B", "model.fc3.lora_A", "model.fc3.lora_B")
        assert rebuilt.new == new and rebuilt.mismatched == () and rebuilt.dropped == (), rebuilt
        assert "carried 10 tensors (10 handed over without a copy) and 2 optimizer states" in self.readme
        assert "new: " + ", ".join(new) in self.readme
        steps = self.run_phase(code_version=2, count=100)
        assert steps[0].scalars["trainable_params"] == 5376.0 and steps[0].scalars["rank"] == 8.0
        assert steps[0].loss < 0.8 and abs(steps[0].loss - before.loss) < 0.3, (before.loss, steps[0].loss)
        assert mean([e.loss for e in steps[-50:]]) < 0.6

    def check_lr(self, edit: TourEdit) -> None:
        """Section 5: a constant step() reads is applied at once, without a rebuild."""
        model = self.live.session.worker.user_state["model"]
        opt = self.live.session.worker.user_state["opt"]
        edit.apply(self.live.root)
        reload = self.live.wait_for(is_event("reload", file="train.py"), timeout=30)
        assert reload.ok and reload.changed == ("LR",) and reload.code_version == 3 and reload.needs_rebuild == (), reload
        assert "RELOAD train.py -> code v3: LR" in self.readme
        # (A "torch.compile caches were reset" note joins it when anything in this process used torch.compile.)
        assert not [note for note in reload.notes if "LR" in note], reload.notes  # step() sets group["lr"] itself
        assert "and no note that the optimizer keeps its old LR" in " ".join(self.readme.split())
        steps = self.live.events.steps(3, lambda e: e.code_version == 3)
        assert all(e.scalars["lr"] == 3e-3 for e in steps)
        assert self.live.session.worker.user_state["model"] is model and self.live.session.worker.user_state["opt"] is opt
        assert opt.param_groups[0]["lr"] == 3e-3


def test_every_tour_edit_has_the_effect_the_readme_describes(tmp_path: Path, one_torch_thread: None) -> None:
    readme = README.read_text(encoding="utf-8")
    edits = tour_edits(README)
    project = copy_sample(tmp_path)
    with open_session(project / "train.py") as live:
        tour = Tour(live, readme)
        checks: dict[str, Callable[[TourEdit], None]] = {
            "rank": tour.check_rank,
            "targets": tour.check_targets,
            "lr": tour.check_lr,
        }
        assert [e.name for e in edits] == list(checks), "every tour edit must be checked, in README order"

        live.wait_for(is_event("setup", status="done"), timeout=120)
        steps = tour.run_phase(code_version=0)
        tour.first_step = steps[0]
        assert steps[0].loss > 3.0 and all(math.isfinite(e.loss) for e in steps)
        assert mean([e.loss for e in steps[100:150]]) < 1.0, "README: below 1 after about 100 steps"
        assert steps[0].scalars == {"lr": 0.01, "rank": 4.0, "trainable_params": 640.0, "frozen_params": float(BASE_ELEMENTS)}
        check_breakdown(breakdown(live), adapter_elements=640, adapter_tensors=2, readme=readme)

        for edit in edits:
            checks[edit.name](edit)
            if edit.name == "targets":  # section 4: the breakdown after both rebuilds
                check_breakdown(breakdown(live), adapter_elements=5376, adapter_tensors=6, readme=readme)
