"""Nothing is lost: snapshots and resume, and every fault survived, on live sessions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import is_event, save
from tests.process_output import finish
from workbench.engine.actions.snapshot import find_snapshot, load_snapshot, snapshots_in
from workbench.engine.run_state import RunState
from workbench.protocol.events import Evaluate, Interrupt, Resume, TakeSnapshot

TRAIN_PY = """\
import time
import torch

SLEEP = 0.003


def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=0.01)}


def step(state, bench):
    time.sleep(SLEEP)
    x = torch.randn(16, 4)
    loss = (state["model"](x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return {"loss": loss, "r": float(torch.rand(()))}
"""


def take_snapshot(live) -> object:
    live.send(TakeSnapshot())
    return live.wait_for(is_event("snapshot"), timeout=20)


def test_resume_restores_weights_optimizer_state_step_and_rng(start_session, tmp_path):
    live = start_session({"train.py": TRAIN_PY}, max_steps=30, exit_at_max_steps=False)
    live.wait_for(is_event("paused", reason="max steps"), timeout=30)
    snap = take_snapshot(live)
    state = live.session.worker.user_state
    weights = {k: v.clone() for k, v in state["model"].state_dict().items()}
    exp_avg = [state["opt"].state[p]["exp_avg"].clone() for p in state["model"].parameters()]
    live.session.worker.max_steps = 33  # three more steps: what the original session draws after the snapshot
    live.send(Resume())
    continued = live.events.steps(3)

    again = start_session({"train.py": TRAIN_PY}, resume=Path(snap.path))
    loaded = again.wait_for(is_event("resume"), timeout=30)
    assert loaded.ok and loaded.step == 30 and loaded.tensors == 4 and loaded.optimizers == 1, loaded
    first = again.events.steps(3)
    assert [e.step for e in first] == [31, 32, 33], "the step counter continues from the snapshot"
    assert [e.scalars["r"] for e in first] == [e.scalars["r"] for e in continued], "RNG state restored"
    assert [round(e.loss, 5) for e in first] == [round(e.loss, 5) for e in continued], "same weights, same optimizer"
    new_state = again.session.worker.user_state
    assert new_state["model"] is not state["model"]
    assert weights and exp_avg


def test_snapshots_keep_the_last_k_and_latest_finds_the_newest(start_session):
    live = start_session({"train.py": TRAIN_PY}, snapshot_keep=2)
    live.wait_running(2)
    paths = []
    for _ in range(4):
        paths.append(take_snapshot(live).path)
        live.events.steps(2)
    folder = live.session.run_dir / "snapshots"
    assert folder.parent.parent == live.root.resolve() / ".vram-bench" / "runs", "each session writes its own run folder"
    kept = snapshots_in(folder)
    assert [str(p) for p in kept] == sorted(set(paths), reverse=True)[:2]
    assert find_snapshot(live.session.state_dir, "latest") == kept[0]
    assert load_snapshot(kept[0])["format"] == "vram-bench-snapshot/1"


def _resumed_into_train_py(start_session, layers: str):
    """A snapshot of TRAIN_PY with other `layers`, resumed into TRAIN_PY: the snapshot, the session and its event."""
    first = start_session({"train.py": TRAIN_PY.replace(
        "torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)", layers)})
    first.wait_running(2)
    snap = take_snapshot(first)
    live = start_session({"train.py": TRAIN_PY}, resume=Path(snap.path))
    return snap, live, live.wait_for(is_event("resume"), timeout=30)


def test_snapshot_of_another_model_loads_nothing_unless_partial(start_session):
    snap, live, refused = _resumed_into_train_py(start_session, "torch.nn.Linear(4, 16), torch.nn.ReLU(), "
                                                 "torch.nn.Linear(16, 1)")
    assert not refused.ok and "nothing was loaded" in refused.error and "--resume-partial" in refused.error
    assert any("model.0.weight (16, 4) -> (8, 4)" in m for m in refused.mismatched)
    live.wait_for(is_event("paused", reason="resume failed"))
    assert live.session.worker.step == 0

    partial = start_session({"train.py": TRAIN_PY}, resume=Path(snap.path), resume_partial=True)
    loaded = partial.wait_for(is_event("resume"), timeout=30)
    assert loaded.ok and loaded.tensors == 1 and len(loaded.mismatched) == 3 and loaded.optimizers == 0  # model.2.bias fits


def test_a_snapshot_of_a_model_with_another_layer_says_so_in_words(start_session):
    """pytorch-cifar's port: `optimizer opt: parameter groups [12] -> [10]` and `... matches.; the run ends`."""
    _, _, refused = _resumed_into_train_py(start_session, "torch.nn.Linear(4, 8), torch.nn.ReLU(), "
                                           "torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)")
    assert not refused.ok and ".;" not in refused.error, refused.error
    assert "; --resume-partial loads what matches; paused on what setup() built" in refused.error, refused.error
    assert any(m == "optimizer opt: the snapshot's optimizer has 1 parameter group of 6 tensors, setup() made one with "
               "1 parameter group of 4 tensors: the model's parameters changed (a layer added or removed?)"
               for m in refused.mismatched), refused.mismatched


def test_damaged_or_missing_snapshots_are_one_line_errors(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(TRAIN_PY)
    folder = project / ".vram-bench" / "snapshots"
    folder.mkdir(parents=True)
    (folder / "step-00000010.pt").write_bytes(b"PK\x03\x04 truncated")
    for spec, needle in (("latest", "step-00000010.pt is damaged"), (str(tmp_path / "nope.pt"), "no such snapshot file")):
        proc = subprocess.run(
            [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--resume", spec],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], proc.stderr


CRASH_CHILD = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    from pathlib import Path
    import torch
    from workbench.engine.actions.snapshot import find_snapshot, load_snapshot, write_snapshot
    from workbench.errors import UserError

    run_dir = Path(sys.argv[1])
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    state = {"model": model, "opt": torch.optim.AdamW(model.parameters())}
    rng = random.Random(1234)
    results = []
    for trial in range(int(sys.argv[2])):
        pid = os.fork()
        if pid == 0:
            step = trial * 1000
            while True:
                step += 1
                write_snapshot(state, step, 0, run_dir, keep=3)
        time.sleep(rng.uniform(0.02, 0.4))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            payload = load_snapshot(find_snapshot(run_dir, "latest"))
            results.append(["ok", int(payload["step"])])
        except UserError as exc:
            results.append(["none" if "no snapshot" in str(exc) else "damaged", str(exc)])
    from workbench.engine.actions.leftovers import remove_leftovers
    temps = lambda: len(list((run_dir / "snapshots").glob(".tmp-*")))
    before = temps()
    removed = remove_leftovers([run_dir / "snapshots"])  # what the next session start does
    print(json.dumps({"results": results, "temp_before": before, "removed": len(removed), "temp_after": temps()}))
    """
)


def test_kill_9_during_snapshots_never_leaves_a_damaged_latest_and_the_next_start_removes_its_temp_files(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), "50"], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert len(results) == 50
    # Kills mid-write leave temp files; the next start removes every one (their writers are gone).
    assert report["temp_before"] > 0 and report["removed"] == report["temp_before"] and report["temp_after"] == 0, report
    assert not [r for r in results if r[0] == "damaged"], results
    assert sum(r[0] == "ok" for r in results) >= 45, "most kills should leave at least one complete snapshot"


HANGS = TRAIN_PY.replace("    time.sleep(SLEEP)\n", "    time.sleep(SLEEP)\n    while bench.step == 3:\n        time.sleep(0.01)\n")


def test_interrupt_stops_a_hung_step_and_the_model_survives(start_session):
    live = start_session({"train.py": HANGS}, slow_step_factor=5, slow_step_seconds=0.5)
    model = live.wait_running(3) and live.session.worker.user_state["model"]
    warning = live.wait_for(lambda e: e.name == "error" and "press i" in e.message, timeout=15)
    assert "step 4 has run for" in warning.message
    live.send(Interrupt())
    error = live.wait_for(is_event("error", where="step"))
    assert "interrupted" in error.message and "train.py" in (error.file or "")
    live.wait_for(is_event("paused", reason="interrupted"))
    assert live.session.worker.user_state["model"] is model
    save(live.entry, HANGS.replace("while bench.step == 3:", "while bench.step == -1:"))
    live.wait_for(is_event("resumed", reason="reload"), timeout=15)
    assert live.events.steps(2)[-1].step >= 4


HANGING_EVALUATE = TRAIN_PY + """

def evaluate(state, bench):
    while bench.step >= 0:  # a stuck evaluation
        time.sleep(0.01)
    return {"val": 1.0}
"""


def test_a_hung_evaluate_is_said_after_the_slow_step_minimum_and_interrupt_stops_it_while_training_goes_on(start_session):
    """evaluate() had no watch: a hung one said nothing and `i` answered "no step is running"."""
    live = start_session({"train.py": HANGING_EVALUATE}, slow_step_factor=5, slow_step_seconds=0.5)
    model = live.wait_running(3) and live.session.worker.user_state["model"]
    live.send(Evaluate())
    warning = live.wait_for(lambda e: e.name == "error" and e.where == "slow step", timeout=15)
    assert warning.message.startswith("evaluate() has run for") and "press i" in warning.message, warning.message
    live.send(Interrupt())
    error = live.wait_for(is_event("error", where="evaluate"), timeout=15)
    assert error.message == "evaluate() was interrupted (i); training goes on" and error.line == line_in(live.entry, "time.sleep(0.01)")
    after = live.events.steps(3)[-1].step
    assert after > 3 and live.session.worker.state is RunState.RUNNING
    assert live.session.worker.user_state["model"] is model
    assert not [e for e in live.events.of("error") if e.where in ("worker", "step")]


def line_in(path: Path, code: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if code in line)


OOM = TRAIN_PY.replace(
    "    x = torch.randn(16, 4)\n",
    "    x = torch.randn(16, 4)\n    if bench.step == 3 and SLEEP:\n"
    "        big = torch.empty(32 * 1024 * 1024)\n        raise torch.OutOfMemoryError('CPU allocator: out of memory (test)')\n",
)


def test_out_of_memory_pauses_with_a_memory_report_and_keeps_the_model(start_session):
    live = start_session({"train.py": OOM})
    model = live.wait_running(3) and live.session.worker.user_state["model"]
    error = live.wait_for(is_event("error", where="step"), timeout=15)
    assert error.message.startswith("out of memory in step()") and "process RSS" in error.message
    live.wait_for(is_event("paused", reason="out of memory"))
    assert live.session.worker.user_state["model"] is model
    save(live.entry, OOM.replace("and SLEEP:", "and not SLEEP:"))
    live.wait_for(is_event("resumed", reason="reload"), timeout=15)
    live.events.steps(2)


@pytest.mark.parametrize(
    "returned, needle",
    [
        ('"a string"', "step() returned 'loss' is a str"),
        ("None", "step() returned None"),
        ("torch.ones(3, requires_grad=True) * 2", "tensor of shape (3,)"),
        ('{"acc": 1.0}', "without a 'loss' key"),
    ],
)
def test_bad_step_returns_pause_with_a_clear_message(start_session, returned, needle):
    source = TRAIN_PY.replace('    return {"loss": loss, "r": float(torch.rand(()))}', f"    return {returned}")
    live = start_session({"train.py": source})
    live.wait_for(is_event("setup", status="done"), timeout=30)
    error = live.wait_for(is_event("error", where="step"))
    assert needle in error.message, error.message
    live.wait_for(is_event("paused", reason="error"))


def test_sigterm_writes_a_final_snapshot_and_exits_cleanly(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(TRAIN_PY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--no-watch"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )
    steps = 0
    deadline = time.monotonic() + 60
    while steps < 5 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        steps += json.loads(line)["event"] == "step" if line else 0
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, timeout=60)
    events = [json.loads(line) for line in out.splitlines()]
    assert proc.returncode == 0, err
    snapshot = next(e for e in events if e["event"] == "snapshot")
    assert snapshot["reason"] == "final" and Path(snapshot["path"]).is_file()
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "quit"
    assert f"final snapshot of step {snapshot['step']} written to {snapshot['path']}" in err
    assert load_snapshot(Path(snapshot["path"]))["step"] == events[-1]["step"]
    assert torch.load(snapshot["path"], weights_only=True)["format"] == "vram-bench-snapshot/1"
    assert os.path.getsize(snapshot["path"]) == snapshot["bytes"]


def test_headless_with_stdin_closed_ends_on_an_error_pause_instead_of_waiting_forever(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(TRAIN_PY.replace("    time.sleep(SLEEP)\n", "    time.sleep(SLEEP)\n    if bench.step == 3:\n        raise ValueError('bad batch')\n"))
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--headless", "--max-steps", "100"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1, proc.stderr
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "error" and events[-1]["step"] == 3
    assert any(e["event"] == "error" and "bad batch" in e["message"] for e in events)
