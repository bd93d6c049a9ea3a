"""A live session: saves hot-swap the code in place, commands act between steps.

Every test runs a real Session (training thread, watcher, reload thread) on a
tiny project in a tmp dir and asserts on the events it publishes.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TRAIN_PY, Live, is_event, line_of, save, save_atomic
from workbench.protocol.events import Pause, ReloadNow, Resume, Rollback, RunCleanup, RunProfile, StepOnce, TakeSnapshot

RETURN_LINE = '    return {"loss": loss, "scale": SCALE}\n'
assert RETURN_LINE in TRAIN_PY


def with_return(extra: str) -> str:
    """TRAIN_PY whose step returns more scalars, e.g. `'"extra": 7.0'`."""
    return TRAIN_PY.replace(RETURN_LINE, f'    return {{"loss": loss, "scale": SCALE, {extra}}}\n')


def consecutive(steps: list[int]) -> bool:
    return steps == list(range(steps[0], steps[0] + len(steps)))


def quiet_for(live: Live, seconds: float, kind: str = "step") -> list:
    """The `kind` events that arrive during a short window in which nothing should happen."""
    start = len(live.events.seen)
    time.sleep(seconds)
    live.events.pull()
    return [e for e in live.events.seen[start:] if e.name == kind]


# --------------------------------------------------------------------------- (1) a step change


def test_saved_step_change_is_used_without_resetting_anything(start_session) -> None:
    live = start_session()
    before = live.wait_running(3)
    state = live.session.worker.user_state
    model, opt = state["model"], state["opt"]
    weight = model.weight

    save(live.entry, with_return('"model_id": float(id(state["model"])), "opt_id": float(id(state["opt"]))'))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert reload.changed == ("step",)
    assert reload.code_version == 1
    assert reload.error is None
    assert reload.ms >= 0

    after = live.events.steps(3, lambda e: e.code_version == 1)
    for event in after:
        assert event.scalars["model_id"] == float(id(model))
        assert event.scalars["opt_id"] == float(id(opt))
        assert event.scalars["scale"] == 1.0
    steps = live.events.of("step")
    numbers = [e.step for e in steps]
    assert numbers[0] == 1 and consecutive(numbers), numbers
    assert after[0].step > before[-1].step
    # Exactly the steps after the reload run the new code.
    for event in steps:
        assert ("model_id" in event.scalars) == (event.code_version == 1), event
    first_new = next(i for i, e in enumerate(live.events.seen) if e.name == "step" and e.code_version == 1)
    assert live.events.seen.index(reload) < first_new
    assert live.session.worker.user_state is state
    assert state["model"] is model and state["opt"] is opt and model.weight is weight
    assert live.session.status().code_version == 1
    assert [v.changed for v in live.session.reloader.history] == [("step",)]


def test_save_without_code_changes_is_reported_as_such(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    save(live.entry, TRAIN_PY)  # the same bytes again
    same = live.wait_for(is_event("reload"))
    assert same.ok and same.changed == () and same.code_version == 0
    assert "no code changes" in same.notes
    save(live.entry, TRAIN_PY.replace("import time\n", "import time  # a comment only\n"))
    comment = live.wait_for(is_event("reload"))
    assert comment.ok and comment.changed == () and comment.code_version == 0, comment
    live.events.steps(2)
    assert live.session.status().code_version == 0
    assert live.session.reloader.history == []


# --------------------------------------------------------------------------- (2) a syntax error


def test_syntax_error_is_reported_and_the_old_code_keeps_running(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    broken = TRAIN_PY.replace("    x = torch.randn(8, 4)\n", "    x = torch.randn(8, 4)\n    y = = 1\n")
    save(live.entry, broken)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok is False
    assert reload.line == line_of(broken, "y = = 1")
    assert reload.error.startswith("syntax error")
    assert "the old code keeps running" in reload.notes
    assert reload.code_version == 0

    later = live.events.steps(5)
    assert consecutive([e.step for e in later])
    assert all(e.code_version == 0 and e.scalars == {"scale": 1.0} for e in later)
    assert live.session.status().state == "running"

    # The failed save does not get in the way of the next good one.
    save(live.entry, with_return('"extra": 7.0'))
    fixed = live.wait_for(is_event("reload", file="train.py"))
    assert fixed.ok and fixed.changed == ("step",) and fixed.code_version == 1
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["extra"] == 7.0


def test_reload_that_breaks_the_step_signature_is_refused(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    broken = TRAIN_PY.replace("def step(state, bench):", "def step(state):")
    save(live.entry, broken)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok is False
    assert reload.line == line_of(broken, "def step(state):")
    assert "does not match the contract" in reload.error
    assert all(e.code_version == 0 for e in live.events.steps(3))


# --------------------------------------------------------------------------- (3) a step that raises


FAILING_STEP = TRAIN_PY.replace(
    "    time.sleep(0.005)\n",
    "    time.sleep(0.005)\n    if bench.step >= 3:\n        raise RuntimeError(f\"boom at {bench.step}\")\n",
)


def test_step_error_pauses_and_a_saved_fix_resumes(start_session) -> None:
    live = start_session({"train.py": FAILING_STEP})
    live.wait_for(is_event("setup", status="done"))
    error = live.wait_for(is_event("error", where="step"))
    assert error.file == "train.py"
    assert error.line == line_of(FAILING_STEP, "raise RuntimeError")
    assert error.message == "step() raised RuntimeError: boom at 3"
    assert "RuntimeError: boom at 3" in error.traceback
    assert f'train.py", line {error.line}, in step' in error.traceback
    assert "workbench/engine/worker.py" not in error.traceback  # the user's frames only
    paused = live.wait_for(is_event("paused"))
    assert (paused.reason, paused.step) == ("error", 3)
    assert [e.step for e in live.events.of("step")] == [1, 2, 3]
    assert quiet_for(live, 0.3) == []
    status = live.session.status()
    assert (status.state, status.pause_reason, status.step) == ("paused", "error", 3)

    save(live.entry, TRAIN_PY)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("step",)
    resumed = live.wait_for(is_event("resumed"))
    assert (resumed.reason, resumed.step) == ("reload", 3)
    steps = live.events.steps(3)
    assert [e.step for e in steps] == [4, 5, 6]
    assert all(e.code_version == 1 for e in steps)


def test_error_in_a_project_module_names_that_module(start_session) -> None:
    helpers = "def check(step):\n    if step >= 2:\n        raise KeyError('missing batch')\n"
    train = TRAIN_PY.replace("import torch\n", "import torch\nfrom helpers import check\n", 1).replace(
        "    time.sleep(0.005)\n", "    time.sleep(0.005)\n    check(bench.step)\n"
    )
    live = start_session({"train.py": train, "helpers.py": helpers})
    error = live.wait_for(is_event("error", where="step"), timeout=30)
    assert (error.file, error.line) == ("helpers.py", 3)
    assert "KeyError" in error.message
    live.wait_for(is_event("paused", reason="error"))
    # A fix in the other module resumes too.
    save(live.root / "helpers.py", "def check(step):\n    return None\n")
    reload = live.wait_for(is_event("reload", file="helpers.py"))
    assert reload.ok and reload.changed == ("check",)
    live.wait_for(is_event("resumed", reason="reload"))
    assert live.events.steps(2)[0].step == 3


# --------------------------------------------------------------------------- (4) atomic-rename saves


def test_atomic_rename_save_is_picked_up(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    save_atomic(live.entry, with_return('"renamed": 1.0'))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("step",), reload
    steps = live.events.steps(2, lambda e: e.code_version == 1)
    assert all(e.scalars["renamed"] == 1.0 for e in steps)
    assert not (live.root / "train.py.tmp").exists()
    # A second rename-save works as well (editors do this on every save).
    save_atomic(live.entry, with_return('"renamed": 2.0'))
    again = live.wait_for(is_event("reload", file="train.py", code_version=2))
    assert again.ok and again.changed == ("step",)
    assert live.events.steps(1, lambda e: e.code_version == 2)[0].scalars["renamed"] == 2.0


# --------------------------------------------------------------------------- (5) forward of a live module

MODEL_PY = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.fwd_version = 0.0

    def forward(self, x):
        self.fwd_version = 1.0
        return self.lin(x)
"""

TRAIN_WITH_MODEL = """\
import time

import torch

from model import Net


def setup(bench):
    torch.manual_seed(0)
    model = Net()
    return {"model": model, "opt": torch.optim.Adam(model.parameters(), lr=0.01)}


def step(state, bench):
    time.sleep(0.005)
    x = torch.randn(8, 4)
    loss = ((state["model"](x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    state["opt"].zero_grad(set_to_none=True)
    loss.backward()
    state["opt"].step()
    return {"loss": loss, "fwd": state["model"].fwd_version}
"""


def test_forward_of_a_live_module_is_patched_in_place(start_session) -> None:
    live = start_session({"train.py": TRAIN_WITH_MODEL, "model.py": MODEL_PY})
    live.wait_running(3)
    model = live.session.worker.user_state["model"]
    opt = live.session.worker.user_state["opt"]
    net_class = type(model)
    forward = net_class.forward
    params = list(model.parameters())
    opt_state = [opt.state[p] for p in params]
    exp_avg = [s["exp_avg"] for s in opt_state]
    adam_steps = float(opt_state[0]["step"])
    assert all(e.scalars["fwd"] == 1.0 for e in live.events.of("step"))

    save(live.root / "model.py", MODEL_PY.replace("self.fwd_version = 1.0", "self.fwd_version = 2.0"))
    reload = live.wait_for(is_event("reload", file="model.py"))
    assert reload.ok and reload.changed == ("Net.forward",), reload
    after = live.events.steps(3, lambda e: e.code_version == 1)
    assert all(e.scalars["fwd"] == 2.0 for e in after)
    assert all(e.scalars["fwd"] == 1.0 for e in live.events.of("step") if e.code_version == 0)

    assert live.session.worker.user_state["model"] is model
    assert type(model) is net_class is sys.modules["model"].Net
    assert net_class.forward is forward  # same function object, new code
    assert 2.0 in forward.__code__.co_consts
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert [p for group in opt.param_groups for p in group["params"]] == params
    assert all(opt.state[p] is s for p, s in zip(params, opt_state, strict=True))
    assert all(opt.state[p]["exp_avg"] is t for p, t in zip(params, exp_avg, strict=True))
    assert float(opt.state[params[0]]["step"]) > adam_steps  # Adam kept counting: its state was not reset


# --------------------------------------------------------------------------- (6) module constants

TRAIN_WITH_CONSTANTS = TRAIN_PY.replace("SCALE = 1.0\n", 'SCALE = 1.0\nMODEL_SIZE = int("3")\n').replace(
    RETURN_LINE, '    return {"loss": loss, "scale": SCALE, "size": MODEL_SIZE}\n'
)


def test_constants_are_rebound_but_statements_with_calls_are_not_rerun(start_session) -> None:
    live = start_session({"train.py": TRAIN_WITH_CONSTANTS})
    live.wait_running(2)
    edited = TRAIN_WITH_CONSTANTS.replace("SCALE = 1.0", "SCALE = 2.0").replace('int("3")', 'int("5")')
    save(live.entry, edited)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert reload.changed == ("SCALE",)
    note = next((n for n in reload.notes if "MODEL_SIZE" in n), None)
    assert note is not None, reload.notes
    assert note.startswith(f"line {line_of(edited, 'MODEL_SIZE')}: `MODEL_SIZE = int(\"5\")` was not re-run")
    assert "run-statements" in note
    steps = live.events.steps(3, lambda e: e.code_version == 1)
    assert all(e.scalars["scale"] == 2.0 and e.scalars["size"] == 3.0 for e in steps)
    module = live.session.project.module
    assert (module.SCALE, module.MODEL_SIZE) == (2.0, 3)


# --------------------------------------------------------------------------- (7) commands


def test_pause_step_once_and_resume(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    live.send(StepOnce())
    refused = live.wait_for(is_event("error", where="command"))
    assert "runs a single step while paused" in refused.message

    live.send(Pause())
    paused = live.wait_for(is_event("paused"))
    assert paused.reason == "user"
    last = [e for e in live.events.seen[: live.events.seen.index(paused)] if e.name == "step"][-1]
    assert paused.step == last.step
    assert quiet_for(live, 0.3) == []
    assert live.session.status().state == "paused"
    assert live.session.status().steps_per_second == 0.0

    live.send(StepOnce())
    one = live.wait_for(is_event("step"))
    assert one.step == paused.step + 1
    assert quiet_for(live, 0.3) == []
    assert live.session.status().state == "paused"
    live.send(Pause())  # pausing again is a no-op
    live.send(StepOnce())
    two = live.wait_for(is_event("step"))
    assert two.step == one.step + 1
    assert [e for e in live.events.after(paused) if e.name == "paused"] == []

    live.send(Resume())
    resumed = live.wait_for(is_event("resumed"))
    assert (resumed.reason, resumed.step) == ("user", two.step)
    assert [e.step for e in live.events.steps(3)] == [two.step + 1, two.step + 2, two.step + 3]


def test_cleanup_reports_freed_bytes(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    live.send(RunCleanup())
    cleanup = live.wait_for(is_event("cleanup"))
    assert isinstance(cleanup.freed_bytes, int) and cleanup.freed_bytes >= 0
    assert cleanup.before["rss"] > 0 and cleanup.after["rss"] > 0
    if not torch.cuda.is_available():
        assert cleanup.freed_bytes == max(cleanup.before["rss"] - cleanup.after["rss"], 0)
    live.events.steps(2)  # training goes on


def test_snapshot_writes_a_checkpoint_under_the_project(start_session) -> None:
    live = start_session()
    live.wait_running(3)
    live.send(TakeSnapshot())
    snap = live.wait_for(is_event("snapshot"))
    path = Path(snap.path)
    folder = live.session.run_dir / "snapshots"
    assert path.parent == folder
    assert path.is_file() and path.stat().st_size == snap.bytes > 0
    assert [p.name for p in folder.iterdir()] == [path.name], "a temp file was left behind"
    data = torch.load(path, weights_only=True)
    assert data["format"] == "vram-bench-snapshot/1"
    assert data["step"] == snap.step >= 3
    assert set(data["modules"]["model"]) == {"weight", "bias"}
    assert data["modules"]["model"]["weight"].shape == (1, 4)
    assert set(data["optimizers"]) == {"opt"}
    live.events.steps(2)


def test_snapshot_and_resume_before_setup_succeeds_are_refused(start_session) -> None:
    failing = TRAIN_PY.replace("    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    raise OSError('dataset not found')\n")
    live = start_session({"train.py": failing})
    live.wait_for(is_event("setup", status="failed"))
    error = live.wait_for(is_event("error", where="setup"))
    assert (error.file, error.line) == ("train.py", line_of(failing, "raise OSError"))
    assert error.message == "setup() raised OSError: dataset not found"
    status = live.session.status()
    assert status.state == "setup failed" and status.setup_error == error.message
    live.send(Resume())
    assert "nothing to resume" in live.wait_for(is_event("error", where="command")).message
    live.send(TakeSnapshot())
    assert "nothing to snapshot yet" in live.wait_for(is_event("error", where="command")).message
    # Saving a fixed setup runs it again, and training starts.
    save(live.entry, TRAIN_PY)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and "setup" in reload.changed
    live.wait_for(is_event("setup", status="done"))
    assert [e.step for e in live.events.steps(2)] == [1, 2]


def test_profile_is_refused_while_paused_then_records_n_steps(start_session) -> None:
    live = start_session(start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    live.wait_for(is_event("paused", reason="user"))
    live.send(RunProfile(steps=2))
    error = live.wait_for(is_event("error", where="command"))
    assert "profiling records the next 2 training steps, but training is paused" in error.message
    assert "resume first" in error.message
    assert live.events.of("profile") == [] and live.events.of("step") == []
    assert not live.session.status().profiling

    live.send(Resume())
    live.send(RunProfile(steps=2))
    started = live.wait_for(is_event("profile", status="started"))
    assert started.steps == 2
    done = live.wait_for(is_event("profile", status="done"), timeout=30)
    between = [e for e in live.events.seen[live.events.seen.index(started) : live.events.seen.index(done)] if e.name == "step"]
    assert len(between) == 3, "the requested steps after one warm-up step"
    trace = Path(done.trace)
    assert trace.parent == live.session.run_dir / "traces"
    assert trace.name.endswith(".json.gz")
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        chrome = json.load(f)
    assert isinstance(chrome["traceEvents"], list) and chrome["traceEvents"]
    assert done.top_ops, "the profile event lists no ops"
    names = [op["name"] for op in done.top_ops]
    assert any(name.startswith("aten::") for name in names), names
    assert all(op["calls"] >= 1 and op["self_cpu_ms"] >= 0 for op in done.top_ops)
    assert not live.session.status().profiling
    live.events.steps(2)


def test_rollback_reverts_to_the_previous_code(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    newer = with_return('"extra": 3.0')
    save(live.entry, newer)
    first = live.wait_for(is_event("reload", file="train.py"))
    assert first.ok and first.code_version == 1
    assert live.events.steps(2, lambda e: e.code_version == 1)[0].scalars["extra"] == 3.0

    live.send(Rollback())
    back = live.wait_for(is_event("reload", code_version=2))
    assert back.ok and back.file == "train.py" and back.changed == ("step",)
    assert any("rolled back version 1" in note for note in back.notes), back.notes
    steps = live.events.steps(3, lambda e: e.code_version == 2)
    assert all("extra" not in e.scalars and e.scalars["scale"] == 1.0 for e in steps)
    assert live.session.reloader.history == []

    live.send(Rollback())
    nothing = live.wait_for(is_event("error", where="command"))
    assert "nothing to roll back" in nothing.message

    # Saving the newer file again brings the change back.
    save(live.entry, newer.replace("3.0", "4.0"))
    again = live.wait_for(is_event("reload", ok=True, code_version=3))
    assert again.changed == ("step",)
    assert live.events.steps(1, lambda e: e.code_version == 3)[0].scalars["extra"] == 4.0


def test_reload_command_applies_saves_when_not_watching(start_session) -> None:
    live = start_session(watch=False)
    live.wait_running(2)
    save(live.entry, with_return('"manual": 1.0'))
    assert quiet_for(live, 0.5, "reload") == []
    live.send(ReloadNow())
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("step",)
    assert live.events.steps(1, lambda e: e.code_version == 1)[0].scalars["manual"] == 1.0


# --------------------------------------------------------------------------- (8) non-finite loss

NAN_AT_STEP_3 = TRAIN_PY.replace(RETURN_LINE, '    if bench.step == 2:\n        loss = loss * float("nan")\n' + RETURN_LINE)


def test_non_finite_loss_pauses(start_session) -> None:
    live = start_session({"train.py": NAN_AT_STEP_3})
    live.wait_for(is_event("setup", status="done"))
    bad = live.wait_for(lambda e: e.name == "step" and not math.isfinite(e.loss), what="a step with a NaN loss")
    assert bad.step == 3
    error = live.wait_for(is_event("error", where="step"))
    assert error.message.startswith("loss is nan at step 3")
    paused = live.wait_for(is_event("paused"))
    assert (paused.reason, paused.step) == ("non-finite loss", 3)
    assert quiet_for(live, 0.3) == []
    assert live.session.status().pause_reason == "non-finite loss"
    # Resuming by hand goes on (the next losses are finite again).
    live.send(Resume())
    live.wait_for(is_event("resumed", reason="user"))
    steps = live.events.steps(2)
    assert [e.step for e in steps] == [4, 5] and all(math.isfinite(e.loss) for e in steps)


def test_saved_fix_after_a_non_finite_loss_resumes(start_session) -> None:
    live = start_session({"train.py": NAN_AT_STEP_3})
    live.wait_for(is_event("paused", reason="non-finite loss"), timeout=30)
    save(live.entry, TRAIN_PY)
    live.wait_for(is_event("reload", ok=True, file="train.py"))
    live.wait_for(is_event("resumed", reason="reload"))
    assert live.events.steps(1)[0].step == 4


NAN_GRADS = """\
import torch


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    state["opt"].zero_grad(set_to_none=True)
    x = torch.randn(8, 4)
    out = state["model"](x)
    if bench.step == 1:
        out = out * float("inf") * 0.0
    loss = out.pow(2).mean()
    loss.backward()
    state["opt"].step()
    return loss
"""


def test_non_finite_loss_names_parameters_with_non_finite_gradients(start_session) -> None:
    live = start_session({"train.py": NAN_GRADS})
    error = live.wait_for(is_event("error", where="step"), timeout=30)
    live.wait_for(is_event("paused", reason="non-finite loss"))
    assert "weight" in error.message and "bias" in error.message, error.message


# --------------------------------------------------------------------------- (9) prints


PRINTING = TRAIN_PY.replace("import time\n", "import sys\nimport time\n").replace(
    "    torch.manual_seed(0)\n", '    torch.manual_seed(0)\n    print("building the model")\n'
).replace(RETURN_LINE, '    print("hello from step", bench.step)\n    print("warn", bench.step, file=sys.stderr)\n' + RETURN_LINE)


def test_prints_become_print_events_never_raw_output(start_session, capfd) -> None:
    live = start_session({"train.py": PRINTING})
    assert live.wait_for(is_event("print", text="building the model")).stream == "stdout"
    live.wait_for(is_event("setup", status="done"))
    for n in range(3):
        out = live.wait_for(is_event("print", text=f"hello from step {n}"))
        assert out.stream == "stdout"
        err = live.wait_for(is_event("print", text=f"warn {n}"))
        assert err.stream == "stderr"
        step = live.wait_for(is_event("step"))
        assert step.step == n + 1
    captured = capfd.readouterr()
    assert "hello from step" not in captured.out + captured.err
    assert "building the model" not in captured.out + captured.err
    assert "warn" not in captured.out + captured.err


# --------------------------------------------------------------------------- which files count


def test_only_imported_python_files_are_reloaded(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    (live.root / "notes.txt").write_text("not code\n")
    (live.root / ".hidden").mkdir()
    (live.root / ".hidden" / "tool.py").write_text("X = 1\n")
    (live.root / ".vram-bench" / "junk.py").write_text("X = 1\n")
    save(live.root / "scratch.py", "def unused():\n    return 1\n")
    reload = live.wait_for(is_event("reload"))
    assert reload.file == "scratch.py", reload
    assert reload.ok and reload.changed == () and reload.code_version == 0
    assert any("not imported by the session" in note for note in reload.notes), reload.notes
    assert quiet_for(live, 0.5, "reload") == []


ADDS_AN_IMPORT = TRAIN_PY.replace("import torch\n", "import torch\nfrom augment import jitter\n", 1).replace(
    RETURN_LINE, '    return {"loss": loss, "scale": SCALE, "jitter": jitter()}\n'
)


def test_first_edit_of_a_module_imported_by_a_reload_is_applied(start_session) -> None:
    live = start_session()
    live.wait_running(2)
    (live.root / "augment.py").write_text("def jitter():\n    return 1.0\n")
    save(live.entry, ADDS_AN_IMPORT)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("step",), reload
    assert live.events.steps(1, lambda e: e.code_version == 1)[0].scalars["jitter"] == 1.0

    save(live.root / "augment.py", "def jitter():\n    return 2.0\n")
    edit = live.wait_for(is_event("reload", file="augment.py"))
    assert edit.ok and edit.changed == ("jitter",), edit
    assert live.events.steps(1, lambda e: e.code_version == 2)[0].scalars["jitter"] == 2.0


# --------------------------------------------------------------------------- cleanup frees real memory

# Planted by the first step, after setup (which ends with a collection before it freezes the survivors).
LEAKY_CYCLE = TRAIN_PY.replace(
    "def setup(bench):\n",
    "class Holder:\n    pass\n\n\nPLANTED = []\n\n\ndef plant_cycle():\n"
    "    a, b = Holder(), Holder()\n    a.other, b.other = b, a\n"
    "    a.payload = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, reachable only through the cycle\n\n\n"
    "def setup(bench):\n",
).replace(
    "def step(state, bench):\n",
    "def step(state, bench):\n    if not PLANTED:\n        PLANTED.append(True)\n        plant_cycle()\n",
)


def test_cleanup_returns_host_memory_held_by_a_garbage_cycle(start_session) -> None:
    import gc

    gc.disable()  # keep the automatic collector from freeing the cycle before cleanup does
    try:
        live = start_session({"train.py": LEAKY_CYCLE})
        live.wait_running(2)
        live.send(RunCleanup())
        cleanup = live.wait_for(is_event("cleanup"))
    finally:
        gc.enable()
    assert cleanup.freed_bytes >= 48 * 1024 * 1024, cleanup
    assert cleanup.before["rss"] - cleanup.after["rss"] >= 48 * 1024 * 1024


# --------------------------------------------------------------------------- a save during a long setup

SLOW_SETUP = """\
import time
import torch
import helper


def setup(bench):
    time.sleep(1.5)  # loading a large model
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def step(state, bench):
    return {"loss": 1.0, "scale": helper.scale()}
"""


def test_a_save_made_while_setup_runs_is_applied_after_it(start_session) -> None:
    live = start_session({"train.py": SLOW_SETUP, "helper.py": "def scale():\n    return 1.0\n"})
    live.wait_for(is_event("setup", status="running"))
    save(live.root / "helper.py", "def scale():\n    return 2.0\n")  # setup is still sleeping
    live.wait_for(is_event("setup", status="done"), timeout=30)
    reload = live.wait_for(is_event("reload", file="helper.py"), timeout=15)
    assert reload.changed == ("scale",), reload
    assert live.events.steps(2, lambda e: e.scalars["scale"] == 2.0)


MANY_SMALL_FREED = """\
import torch

HELD = {}


def setup(bench):
    # 4,000 tensors of 64 KiB (250 MiB) from the C heap, with small live ones in between: freeing the big
    # ones leaves the memory resident in the heap, where the C library keeps it for reuse.
    HELD["big"] = [torch.ones(16 * 1024) for _ in range(4000)]
    HELD["pins"] = [torch.ones(10) for _ in range(80)]
    return {}


def step(state, bench):
    HELD.pop("big", None)
    return 1.0
"""


def test_cleanup_hands_freed_c_heap_back_to_the_system(start_session) -> None:
    from workbench.engine.actions.cleanup import trim_c_heap

    if not trim_c_heap():
        pytest.skip("the C library has no malloc_trim (not glibc)")
    live = start_session({"train.py": MANY_SMALL_FREED})
    live.wait_running(3)
    live.send(RunCleanup())
    cleanup = live.wait_for(is_event("cleanup"))
    assert cleanup.before["rss"] - cleanup.after["rss"] >= 150 * 1024 * 1024, cleanup
