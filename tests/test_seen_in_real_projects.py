"""Issue 13, "What was seen": each case found by porting real trainers, as a test that failed before its fix.

Real sessions on small projects in tmp dirs (see conftest.py): save, wait for the reload event,
run steps, and check the code that runs is the code on disk, or the event says what is not.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from conftest import is_event, save

# --------------------------------------------------------------------------- closures after a shifted save

CLOSURE_PY = """\
import torch


def make_scale():
    def f(x):
        return x * 2.0
    return f


def make_counter():
    def gen():
        while True:
            yield 1.0
    return gen()


def setup(bench):
    return {"scale": make_scale(), "gen": make_counter(), "model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "closure": state["scale"](1.0), "gen": next(state["gen"])}
"""


def test_closure_edit_after_a_line_shift_reaches_the_live_closure(start_session) -> None:
    live = start_session({"train.py": CLOSURE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    shifted = "# a comment that moves every function down\n\n" + CLOSURE_PY
    save(live.entry, shifted)
    live.wait_for(is_event("reload", file="train.py"))
    save(live.entry, shifted.replace("x * 2.0", "x * 3.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and "make_scale" in reload.changed, reload
    assert any("1 live closure" in note for note in reload.notes), reload.notes
    live.send(__import__("workbench.protocol.events", fromlist=["StepOnce"]).StepOnce())
    step = live.wait_for(is_event("step"))
    assert step.scalars["closure"] == 3.0


def test_running_generator_is_named_after_a_line_shift(start_session) -> None:
    live = start_session({"train.py": CLOSURE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    shifted = "# a comment\n" + CLOSURE_PY
    save(live.entry, shifted)
    live.wait_for(is_event("reload", file="train.py"))
    save(live.entry, shifted.replace("yield 1.0", "yield 2.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok, reload
    assert any("running generator" in note and "make_counter" in note for note in reload.notes), reload.notes


CAPTURE_PY = CLOSURE_PY.replace("    def f(x):\n        return x * 2.0", "    k = 2.0\n\n    def f(x):\n        return x * k")


def test_a_closure_keeps_what_it_captured_from_a_changed_factory_and_the_reload_says_so(start_session) -> None:
    from workbench.protocol.events import StepOnce

    live = start_session({"train.py": CAPTURE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, CAPTURE_PY.replace("k = 2.0", "k = 3.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and "make_scale" in reload.changed, reload
    assert any("keep the values" in n and "make_scale.<locals>.f" in n for n in reload.notes), reload.notes
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars["closure"] == 2.0, "what it captured stays: said above, not silent"


def test_rollback_after_a_rebuild_names_what_the_live_state_keeps(start_session) -> None:
    from workbench.protocol.events import Rebuild, Rollback, StepOnce

    source = CAPTURE_PY.replace('"model": torch.nn.Linear(1, 1)', '"model": Net()').replace(
        "def setup(bench):", "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.width = 1\n\n\ndef setup(bench):"
    )
    live = start_session({"train.py": source}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    newer = source.replace("self.width = 1", "self.width = 2").replace("k = 2.0", "k = 3.0")
    save(live.entry, newer)
    held = live.wait_for(is_event("reload", file="train.py"))
    assert "Net.__init__" in held.held, held
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild")).ok
    live.send(Rollback())
    rolled = live.wait_for(is_event("reload", file="train.py"))
    said = " ".join((*rolled.needs_rebuild, *rolled.notes))
    assert "Net.__init__" in said and "model" in said, rolled  # the model was built by the rolled-back __init__
    assert "make_scale.<locals>.f" in said, rolled  # the closure setup() made keeps k = 3.0
    assert "R (command `rebuild`)" in said, rolled
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars["closure"] == 3.0
    assert live.session.worker.user_state["model"].width == 2


# --------------------------------------------------------------------------- models in module globals

# A model whose __init__ the tests edit (`self.tag = 0`), so a save is held for a rebuild.
NET_PY = """class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, 1)
        self.tag = 0

    def forward(self, x):
        return self.fc(x)
"""

GLOBAL_MODEL_PY = """\
import torch

MODEL = None
OPT = None
WIDTH = 8


""" + NET_PY + """

def setup(bench):
    global MODEL, OPT
    MODEL = Net()
    OPT = torch.optim.AdamW(MODEL.parameters(), lr=1e-3)
    return {"model": MODEL, "opt": OPT}


def step(state, bench):
    loss = MODEL(torch.ones(2, WIDTH)).pow(2).mean()
    loss.backward()
    OPT.step()
    OPT.zero_grad(set_to_none=True)
    return loss
"""


def test_rebuilds_leave_one_model_alive_when_setup_keeps_it_in_a_module_global(start_session) -> None:
    from workbench.protocol.events import Rebuild, RunCleanup

    live = start_session({"train.py": GLOBAL_MODEL_PY})
    live.wait_running(2)
    models = [weakref.ref(live.session.worker.user_state["model"])]
    source = GLOBAL_MODEL_PY
    for n in range(1, 4):
        source = source.replace(f"self.tag = {n - 1}", f"self.tag = {n}")
        save(live.entry, source)
        held = live.wait_for(is_event("reload", file="train.py"))
        assert held.needs_rebuild, held
        live.send(Rebuild())
        assert live.wait_for(is_event("rebuild")).ok
        live.send(RunCleanup())
        live.wait_for(is_event("cleanup"))
        live.events.steps(1)
        models.append(weakref.ref(live.session.worker.user_state["model"]))
    gc.collect()
    assert live.session.project.module.MODEL.tag == 3
    alive = [n for n, ref in enumerate(models) if ref() is not None]
    assert alive == [3], f"models alive after three rebuilds (0 is setup's): {alive}"


# --------------------------------------------------------------------------- scripts with argparse at import

ARGPARSE_PY = """\
import argparse
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--width", type=int, default=2)
args = parser.parse_args()
BATCH = args.batch_size
ARGV = list(sys.argv)


def setup(bench):
    return {"model": torch.nn.Linear(args.width, 1)}


def step(state, bench):
    return {"loss": 0.0, "batch": float(BATCH), "width": float(args.width)}
"""


def test_run_statements_runs_an_edited_parser_again_with_what_depends_on_it(start_session) -> None:
    from workbench.protocol.events import RunStatements, StepOnce

    live = start_session({"train.py": ARGPARSE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, ARGPARSE_PY.replace("default=2", "default=3"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert any("press x" in note for note in reload.notes), reload.notes
    assert any("x also runs" in note for note in reload.notes), reload.notes
    live.send(RunStatements())
    ran = live.wait_for(is_event("reload", file="train.py"))
    assert ran.ok and {"parser", "args"} <= set(ran.changed), ran
    assert "BATCH" not in ran.changed and any("line(s) 10: `BATCH = args.batch_size`" in n for n in ran.notes), \
        "args.batch_size did not change, so BATCH is left as it was"
    live.send(StepOnce())
    step = live.wait_for(is_event("step"))
    assert step.scalars["width"] == 3.0 and step.scalars["batch"] == 4.0


def test_a_rebuild_runs_the_statements_of_a_change_held_for_it_before_it_builds(start_session) -> None:
    """`--width`'s default and the model's `Linear(args.width, 2)` edited in one save: R alone builds the model a
    fresh start would, `Linear(3, 2)`. It used to run setup() with the old `args` (a `Linear(2, 2)`) and leave the
    parser for x, while the rebuild event said it had built the new code."""
    from workbench.protocol.events import Rebuild, RunStatements, StepOnce

    live = start_session({"train.py": ARGPARSE_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    edited = (ARGPARSE_PY.replace("default=2", "default=3").replace("Linear(args.width, 1)", "Linear(args.width, 2)")
              .replace('"width": float(args.width)}', '"width": float(args.width), "inputs": float(state["model"].in_features)}'))
    save(live.entry, edited)
    held = live.wait_for(is_event("reload", file="train.py"))
    assert "setup" in held.held, held
    live.send(RunStatements())
    refused = live.wait_for(is_event("error", where="command"))
    assert "held for a rebuild" in refused.message and "R (command `rebuild`)" in refused.message, refused
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok, rebuilt
    assert any("had not re-run" in note and "args = parser.parse_args()" in note for note in rebuilt.notes), rebuilt.notes
    live.send(StepOnce())
    step = live.wait_for(is_event("step"))
    assert step.scalars["width"] == 3.0 and step.scalars["inputs"] == 3.0, step.scalars
    live.send(RunStatements())
    assert "no held-back module statements" in live.wait_for(is_event("error", where="command")).message


# --------------------------------------------------------------------------- the script as `python train.py ARGS` runs it

SCRIPT_PY = """\
import argparse
import os
import sys

import torch

print("banner at import")
sys.stdout.write("config: lr=0.1\\n")
os.write(1, b"native write at import\\n")
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
args = parser.parse_args()
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()))
with open("data.txt") as f:  # a path relative to the project folder
    DATA = f.read().strip()


def setup(bench):
    print("setup says hi")
    os.write(1, b"native write in setup\\n")
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "batch": float(args.batch_size), "data": float(DATA)}
"""


def test_headless_script_gets_its_arguments_its_folder_and_a_clean_protocol(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from conftest import make_project

    root = make_project(tmp_path, {"train.py": SCRIPT_PY, "data.txt": "7\n"})
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--max-steps", "1",
         "--", "--batch-size", "8"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]  # every stdout line is a protocol line
    assert events[0]["event"] == "start"
    printed = [e["text"] for e in events if e["event"] == "print"]
    assert printed[:4] == ["banner at import", "config: lr=0.1", "argv ['--batch-size', '8'] cwd proj", "setup says hi"]
    step = next(e for e in events if e["event"] == "step")
    assert step["scalars"] == {"batch": 8.0, "data": 7.0}
    assert "native write at import" in proc.stderr and "native write in setup" in proc.stderr


def test_a_script_that_fails_at_import_shows_what_it_printed_and_one_error_line(tmp_path) -> None:
    import subprocess
    import sys

    from conftest import make_project

    root = make_project(tmp_path, {"train.py": "print('loading config')\nraise RuntimeError('no config')\n"})
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "loading config",
        f"vram-bench: error: {root / 'train.py'}:2: importing train.py raised RuntimeError: no config. Fix it and run again.",
    ]


def test_a_relative_resume_path_means_where_the_user_typed_it(tmp_path) -> None:
    import json
    import subprocess
    import sys

    import torch

    from conftest import TRAIN_PY, make_project
    from workbench.engine.actions.snapshot import write_snapshot

    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    written = write_snapshot({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}, 7, 0, tmp_path / "elsewhere", 5)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--max-steps", "8",
         "--resume", str(Path(written.path).relative_to(tmp_path))],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    resumed = next(json.loads(line) for line in proc.stdout.splitlines() if '"event":"resume"' in line)
    assert resumed["ok"] and resumed["step"] == 7, resumed


# --------------------------------------------------------------------------- a dataclass config held by the model

CONFIG_MODEL_PY = """\
from dataclasses import dataclass

import torch


@dataclass
class Config:
    width: int = 4
    scale: float = 1.0


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = torch.nn.Linear(config.width, 1)

    def forward(self, x):
        return self.fc(x) * self.config.scale
"""

CONFIG_TRAIN_PY = """\
import torch

from model import GPT, Config


def setup(bench):
    return {"model": GPT(Config())}


def step(state, bench):
    return {"loss": 0.0, "scale": state["model"].config.scale}
"""


def test_a_changed_dataclass_whose_instance_the_model_holds_is_held_for_rebuild(start_session) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    live = start_session({"train.py": CONFIG_TRAIN_PY, "model.py": CONFIG_MODEL_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.root / "model.py", CONFIG_MODEL_PY.replace("scale: float = 1.0", "scale: float = 2.0"))
    reload = live.wait_for(is_event("reload", file="model.py"))
    assert any("model.config" in reason for reason in reload.needs_rebuild), reload
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild")).ok
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars["scale"] == 2.0


# --------------------------------------------------------------------------- a held change saved back

HELD_PY = """\
import torch


def setup(bench):
    return {"model": torch.nn.Linear(1, 1), "made_by": 1.0}


def step(state, bench):
    return {"loss": 0.0, "made_by": state["made_by"]}
"""


def test_a_held_setup_edit_saved_back_is_dropped_and_a_rebuild_runs_the_code_on_disk(start_session) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    live = start_session({"train.py": HELD_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, HELD_PY.replace('"made_by": 1.0', '"made_by": 2.0'))
    held = live.wait_for(is_event("reload", file="train.py"))
    assert held.needs_rebuild and "setup" in held.held, held
    assert live.session.status().needs_rebuild == ("train.py",)
    save(live.entry, HELD_PY)
    dropped = live.wait_for(is_event("reload", file="train.py"))
    assert any("held for a rebuild is dropped" in note for note in dropped.notes), dropped
    assert live.session.status().needs_rebuild == ()
    live.send(Rebuild())
    assert live.wait_for(is_event("rebuild")).ok
    live.send(StepOnce())
    assert live.wait_for(is_event("step")).scalars["made_by"] == 1.0


# --------------------------------------------------------------------------- a trainer's own evaluate()

OWN_EVALUATE_PY = """\
import torch


def evaluate(data_source):
    raise AssertionError("vram-bench must not call the project's own evaluate(data_source)")


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return 0.0
"""


def test_a_trainers_own_evaluate_with_another_signature_is_ignored_and_said_once(start_session) -> None:
    from workbench.protocol.events import Evaluate

    live = start_session({"train.py": OWN_EVALUATE_PY}, eval_every=1)
    live.wait_running(3)
    notices = [e for e in live.events.of("error") if e.where == "contract"]
    assert len(notices) == 1 and "evaluate(data_source) is not vram-bench's evaluate(state, bench)" in notices[0].message
    assert notices[0].is_warning
    live.send(Evaluate())
    refused = live.wait_for(is_event("error", where="command"))
    assert "defines no evaluate(state, bench)" in refused.message
    assert not [e for e in live.events.of("error") if e.where == "evaluate"]


# --------------------------------------------------------------------------- the app's log

async def test_the_apps_log_shows_a_successful_resume_and_what_the_project_printed_at_import(tmp_path) -> None:
    import torch

    from conftest import TRAIN_PY, make_project
    from tests.test_tui import log_text, until
    from workbench.engine.actions.snapshot import write_snapshot
    from workbench.engine.early_output import EarlyOutput
    from workbench.engine.project import load_project
    from workbench.engine.session import Session, SessionConfig
    from workbench.frontends.tui.app import make_app

    root = make_project(tmp_path, {"train.py": "print('banner from import')\n" + TRAIN_PY})
    model = torch.nn.Linear(4, 1)
    snap = write_snapshot({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}, 12, 0, tmp_path / "old", 5)
    early = EarlyOutput()
    with early.capture():
        project = load_project(root / "train.py")
    config = SessionConfig(device=torch.device("cpu"), exit_at_max_steps=False, resume=Path(snap.path), start_paused=True)
    session = Session(project, config, early_output=early)
    app = make_app(session)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: "RESUMED FROM" in log_text(app), what="the resume line")
            text = log_text(app)
            assert "at step 12: 2 tensors (2 mapped from the file, no copy), 1 optimizer(s)" in " ".join(text.split())
            assert "[stdout] banner from import" in text
    finally:
        session.close()


# --------------------------------------------------------------------------- commands with absurd arguments

def test_profile_steps_are_capped_and_profile_0_cancels(start_session) -> None:
    import pytest

    from workbench.protocol.events import MAX_PROFILE_STEPS, CommandError, RunProfile, parse_command

    with pytest.raises(CommandError, match=f"1 to {MAX_PROFILE_STEPS} steps"):
        parse_command("profile 999999999")
    with pytest.raises(CommandError) as refused:
        parse_command("x" * 10_000_000)
    assert len(str(refused.value)) < 300 and "10,000,000 characters" in str(refused.value)
    assert parse_command("profile 0") == RunProfile(steps=0)

    live = start_session()
    live.wait_running(2)
    live.send(RunProfile(steps=0))
    assert "none is running" in live.wait_for(is_event("error", where="command")).message
    live.send(RunProfile(steps=MAX_PROFILE_STEPS))
    live.wait_for(is_event("profile", status="started"))
    live.send(RunProfile(steps=0))
    cancelled = live.wait_for(is_event("profile"))
    assert cancelled.status == "cancelled" and 0 < cancelled.steps <= MAX_PROFILE_STEPS + 1
    assert not live.session.worker.profiling
    assert not list((live.session.run_dir / "traces").glob("*.json*")), "a cancelled profile writes no trace"


# --------------------------------------------------------------------------- failures while the session starts

def test_a_latin_1_source_with_a_coding_cookie_runs_and_reloads(tmp_path) -> None:
    from conftest import TRAIN_PY, open_session

    source = "# -*- coding: latin-1 -*-\n# Gr\u00f6\u00dfe\n" + TRAIN_PY
    root = tmp_path / "latin1"
    root.mkdir()
    (root / "train.py").write_bytes(source.encode("latin-1"))
    with open_session(root / "train.py") as live:
        live.wait_running(1)
        (root / "train.py").write_bytes(source.replace("SCALE = 1.0", "SCALE = 2.0").encode("latin-1"))
        reload = live.wait_for(is_event("reload", file="train.py"))
        assert reload.ok and reload.changed == ("SCALE",), reload


def test_a_vram_bench_file_in_the_project_is_one_error_line_and_exit_2(tmp_path) -> None:
    import subprocess
    import sys

    from conftest import TRAIN_PY, make_project

    root = make_project(tmp_path, {"train.py": TRAIN_PY, ".vram-bench": "not a folder"})
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ".vram-bench is a file" in lines[0] and "Move or rename" in lines[0], proc.stderr


def test_an_unwritable_project_keeps_its_artifacts_in_the_users_state_folder(tmp_path, monkeypatch) -> None:
    from workbench.engine import state_folder

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project = tmp_path / "shared_checkout"
    project.mkdir()
    monkeypatch.setattr(state_folder, "_can_write_in", lambda folder: not str(folder).startswith(str(project)))
    folder, note = state_folder.choose_state_folder(project)
    assert folder.is_dir() and folder.is_relative_to(tmp_path / "state" / "vram-bench")
    assert note is not None and str(folder) in note
    assert state_folder.choose_state_folder(project)[0] == folder, "the same project gets the same folder each run"


# --------------------------------------------------------------------------- an error raised in a module a save imports

def test_an_error_in_a_module_the_save_imports_names_that_module_and_line(start_session) -> None:
    from conftest import TRAIN_PY

    live = start_session({"train.py": TRAIN_PY, "helper.py": "X = 1\n\nraise ValueError('bad helper')\n"})
    live.wait_running(1)
    save(live.entry, "import helper\n" + TRAIN_PY)
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert not reload.ok and reload.line == 1, reload
    assert "ValueError: bad helper" in reload.error and "helper.py:3" in reload.error, reload.error


# --------------------------------------------------------------------------- a Dataset edit and the loader's workers

LOADER_PY = """\
import torch
from torch.utils.data import DataLoader, Dataset


def scale(i):
    return float(i) * 1.0


class Numbers(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([scale(i)])


def setup(bench):
    loader = DataLoader(Numbers(), batch_size=8, num_workers=1, persistent_workers=PERSISTENT)
    return {"loader": loader, "it": iter(loader), "model": torch.nn.Linear(1, 1)}


def step(state, bench):
    try:
        batch = next(state["it"])
    except StopIteration:
        state["it"] = iter(state["loader"])
        batch = next(state["it"])
    return {"loss": 0.0, "first": float(batch[0, 0])}
"""


def test_a_dataset_edit_says_the_loader_workers_keep_the_old_code(tmp_path) -> None:
    from conftest import make_project, open_session

    for persistent in (True, False):
        source = "PERSISTENT = %s\n" % persistent + LOADER_PY
        root = make_project(tmp_path, {"train.py": source}, folder=f"persistent_{persistent}")
        with open_session(root / "train.py") as live:
            _check_loader_notes(live, source, persistent)
        # The loader's worker processes end with the state that holds them, here and not in a later test.
        gc.collect()


def _check_loader_notes(live, source: str, persistent: bool) -> None:
    live.wait_running(2)
    save(live.entry, source.replace("float(i) * 1.0", "float(i) * 2.0"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("scale",), reload
    said = [n for n in reload.notes if "worker process" in n]
    assert len(said) == 1 and "state['loader']" in said[0] and "scale" in said[0], reload.notes
    assert "R (command `rebuild`)" in said[0], said  # setup() makes the loader: R starts new workers either way
    assert ("next epoch" in said[0]) is not persistent, said
    assert ("of its 8 batches from now" in said[0]) is not persistent, said  # its live iterator was found
    # A change the workers never run says nothing about them.
    save(live.entry, source.replace("float(i) * 1.0", "float(i) * 2.0").replace('"loss": 0.0', '"loss": 1.0'))
    other = live.wait_for(is_event("reload", file="train.py"))
    assert other.changed == ("step",) and not any("worker" in n for n in other.notes), other


# --------------------------------------------------------------------------- optimizers setup() does not make

LAZY_OPTIMIZERS_PY = """\
import torch

OPT_G = None
WIDTH = 2


""" + NET_PY + """

def setup(bench):
    torch.manual_seed(0)
    return {"gen": Net(), "disc": Net()}


def step(state, bench):
    global OPT_G
    if OPT_G is None:  # made on first use, in a module global
        OPT_G = torch.optim.SGD(state["gen"].parameters(), lr=0.1, momentum=0.9)
    if "opt_d" not in state:  # made on first use, in the state
        state["opt_d"] = torch.optim.Adam(state["disc"].parameters(), lr=0.01)
    x = torch.ones(4, WIDTH)
    loss = state["gen"](x).pow(2).mean() + state["disc"](x).pow(2).mean()
    loss.backward()
    OPT_G.step()
    state["opt_d"].step()
    OPT_G.zero_grad()
    state["opt_d"].zero_grad()
    return loss
"""


def test_a_rebuild_carries_optimizers_step_makes_and_they_train_the_new_model(start_session) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    live = start_session({"train.py": LAZY_OPTIMIZERS_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for _ in range(3):
        live.send(StepOnce())
        live.wait_for(is_event("step"))
    old_disc_state = live.session.worker.user_state["opt_d"].state
    assert len(old_disc_state) == 2
    save(live.entry, LAZY_OPTIMIZERS_PY.replace("self.tag = 0", "self.tag = 1"))
    assert live.wait_for(is_event("reload", file="train.py")).needs_rebuild
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok, rebuilt
    said = " ".join(rebuilt.notes)
    assert "state['opt_d']" in said and "train.OPT_G" in said and "made again" in said, rebuilt.notes
    state, module = live.session.worker.user_state, live.session.project.module
    new_gen, new_disc = state["gen"], state["disc"]
    assert {id(p) for g in module.OPT_G.param_groups for p in g["params"]} == {id(p) for p in new_gen.parameters()}
    assert {id(p) for g in state["opt_d"].param_groups for p in g["params"]} == {id(p) for p in new_disc.parameters()}
    assert module.OPT_G.param_groups[0]["momentum"] == 0.9 and len(module.OPT_G.state) == 2, "its state came along"
    assert state["opt_d"].state[new_disc.fc.weight]["step"] == 3
    before = new_gen.fc.weight.detach().clone()
    live.send(StepOnce())
    live.wait_for(is_event("step"))
    assert not torch_equal(new_gen.fc.weight, before), "the new model trains (the optimizer was not left on the old one)"


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a.detach(), b))


def test_a_snapshot_keeps_optimizers_step_makes_and_resume_loads_them_when_they_appear(start_session) -> None:
    import torch

    from workbench.protocol.events import StepOnce, TakeSnapshot

    live = start_session({"train.py": LAZY_OPTIMIZERS_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for _ in range(3):
        live.send(StepOnce())
        live.wait_for(is_event("step"))
    live.send(TakeSnapshot())
    snap = live.wait_for(is_event("snapshot"))
    saved = torch.load(snap.path, weights_only=True)
    assert set(saved["optimizers"]) == {"opt_d", "train.OPT_G"}, "the module-global optimizer is in the snapshot too"
    momentum = live.session.project.module.OPT_G.state[live.session.worker.user_state["gen"].fc.weight]["momentum_buffer"].clone()

    again = start_session({"train.py": LAZY_OPTIMIZERS_PY}, resume=Path(snap.path), start_paused=True)
    resumed = again.wait_for(is_event("resume"))
    assert resumed.ok and resumed.step == 3 and not resumed.late, resumed
    assert any("opt_d" in n and "setup() does not make it" in n for n in resumed.notes), resumed.notes
    assert any("train.OPT_G" in n for n in resumed.notes), resumed.notes
    again.send(StepOnce())
    late = again.wait_for(is_event("resume"))
    assert late.late and late.optimizers == 2 and late.step == 4, late
    state, module = again.session.worker.user_state, again.session.project.module
    assert state["opt_d"].state[state["disc"].fc.weight]["step"] == 3, "Adam's step count came from the snapshot"
    assert torch.equal(module.OPT_G.state[state["gen"].fc.weight]["momentum_buffer"], momentum)


# --------------------------------------------------------------------------- a constant that module statements with calls use

POLY_PY = """\
import torch

DEGREE = 4
W_TARGET = torch.ones(DEGREE, 1)
fc = torch.nn.Linear(W_TARGET.size(0), 1)


def setup(bench):
    return {"fc": fc}


def step(state, bench):
    x = torch.ones(2, DEGREE)
    return {"loss": 0.0, "out": float(x.mm(W_TARGET).sum()), "width": float(fc.in_features)}
"""


def test_statements_that_use_a_changed_constant_are_offered_to_x_and_r_rebuilds_the_model_they_shape(start_session) -> None:
    from workbench.protocol.events import Rebuild, RunStatements

    live = start_session({"train.py": POLY_PY})
    live.wait_running(1)
    save(live.entry, POLY_PY.replace("DEGREE = 4", "DEGREE = 3"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.changed == ("DEGREE",), reload
    said = " ".join(reload.notes)
    assert "W_TARGET = torch.ones(DEGREE, 1)" in said and "press x" in said and "restart" not in said, reload.notes
    assert "x leaves line 5: `fc = torch.nn.Linear(W_TARGET.size(0), 1)`" in said and "line(s) 5" not in said, \
        "what uses W_TARGET is the live model: said as x's to leave for R, not listed among what x runs"
    live.wait_for(is_event("paused", reason="error"))  # the new DEGREE against the old W_TARGET: shapes differ
    live.send(RunStatements())
    ran = live.wait_for(is_event("reload", file="train.py"))
    assert ran.ok and ran.changed == ("W_TARGET",), ran
    assert any(n.startswith("left line 5: `fc = torch.nn.Linear(W_TARGET.size(0), 1)` for a rebuild: W_TARGET changed")
               for n in ran.notes), "x leaves the live model to R, which carries what fits"
    live.wait_for(is_event("resumed", reason="reload"))  # as a saved fix resumes, with the old fc until R
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.mismatched == ("fc.weight (1, 4) -> (1, 3)",), rebuilt
    step = live.wait_for(is_event("step"))  # the first step after the rebuild (waits look at new events only)
    assert step.scalars["out"] == 6.0 and step.scalars["width"] == 3.0, step.scalars


# --------------------------------------------------------------------------- a default the command line overrides

OVERRIDE_PY = """\
import argparse

import torch

batch_size = 8
width = 2
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int)
args = parser.parse_args()
if args.batch_size is not None:
    batch_size = args.batch_size
width = int(width)


def setup(bench):
    return {"model": torch.nn.Linear(1, 1)}


def step(state, bench):
    return {"loss": 0.0, "batch": float(batch_size), "width": float(width)}
"""


def test_an_edited_default_is_bound_again_by_the_override_below_it(tmp_path) -> None:
    from conftest import make_project, open_session

    from workbench.protocol.events import StepOnce

    root = make_project(tmp_path, {"train.py": OVERRIDE_PY})
    with open_session(root / "train.py", start_paused=True, argv=["--batch-size", "4"]) as live:
        live.wait_for(is_event("setup", status="done"))
        assert live.session.project.module.batch_size == 4
        save(live.entry, OVERRIDE_PY.replace("batch_size = 8", "batch_size = 12").replace("width = 2", "width = 3"))
        reload = live.wait_for(is_event("reload", file="train.py"))
        said = " ".join(reload.notes)
        assert "line 10: `if args.batch_size is not None:` binds batch_size again" in said, reload.notes
        assert "line 12: `width = int(width)` uses width but was not re-run" in said, reload.notes
        live.send(StepOnce())
        step = live.wait_for(is_event("step"))
        assert step.scalars["batch"] == 4.0, "the command line's value, as a fresh start with --batch-size 4 gives"
        assert step.scalars["width"] == 3.0  # the edit; int(width) not re-run, and said so


def test_an_edited_default_above_a_configurator_exec_says_the_override_may_win(tmp_path) -> None:
    """nanoGPT's train.py: defaults, then `exec(open('configurator.py').read())` overrides them (here by a path
    the test can find without changing the working directory, as the CLI does)."""
    from conftest import make_project, open_session

    from workbench.protocol.events import RunStatements, StepOnce

    train = OVERRIDE_PY.replace(
        "if args.batch_size is not None:\n    batch_size = args.batch_size\n", "exec(open(__file__[:-8] + 'configurator.py').read())\n"
    )
    root = make_project(tmp_path, {"train.py": train, "configurator.py": "batch_size = 5\n"})
    with open_session(root / "train.py", start_paused=True) as live:
        live.wait_for(is_event("setup", status="done"))
        save(live.entry, train.replace("batch_size = 8", "batch_size = 12").replace("width = 2", "width = 7"))
        reload = live.wait_for(is_event("reload", file="train.py"))
        said = " ".join(n for n in reload.notes if "configurator" in n)
        assert "`exec(open(__file__[:-8] + 'configurator.py').read())` set batch_size = 5 at start" in said, reload.notes
        assert "press x" in said and "width" not in said, "width kept the file's value: nothing to say of it"
        live.send(RunStatements())
        assert live.wait_for(is_event("reload", file="train.py")).ok
        live.send(StepOnce())
        assert live.wait_for(is_event("step")).scalars["batch"] == 5.0, "the configurator's value, as a fresh start"


# --------------------------------------------------------------------------- a model only a module global holds

GLOBAL_ONLY_PY = """\
import torch

model = None
WIDTH = 4
""" + NET_PY.replace("torch.nn.Linear(WIDTH, 1)", "torch.nn.Linear(WIDTH, 1)\n        self.fail = False") + """

def setup(bench):
    global model
    model = Net()
    if model.fail:
        raise RuntimeError("this setup() fails half way")
    return {}


def step(state, bench):
    with torch.no_grad():
        model.fc.weight.add_(1.0)  # "training": the weights move every step
    return {"loss": 0.0, "w": float(model.fc.weight.detach().sum()), "tag": float(model.tag)}
"""


def test_a_rebuild_carries_a_model_only_a_module_global_holds_and_a_failed_one_puts_it_back(start_session) -> None:
    from workbench.protocol.events import Rebuild, StepOnce

    live = start_session({"train.py": GLOBAL_ONLY_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    for _ in range(3):
        live.send(StepOnce())
        trained = live.wait_for(is_event("step")).scalars["w"]
    module = live.session.project.module
    old_model = module.model

    save(live.entry, GLOBAL_ONLY_PY.replace("self.fail = False", "self.fail = True"))
    assert live.wait_for(is_event("reload", file="train.py")).needs_rebuild  # Net.__init__ of a model in a global
    live.send(Rebuild())
    assert not live.wait_for(is_event("rebuild")).ok
    assert module.model is old_model, "a failed rebuild changes nothing: the global is the trained model again"

    save(live.entry, GLOBAL_ONLY_PY.replace("self.tag = 0", "self.tag = 1"))
    live.wait_for(is_event("reload", file="train.py"))
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"))
    assert rebuilt.ok and rebuilt.tensors_carried == 2, rebuilt  # train.model.fc.weight and .bias
    live.send(StepOnce())
    step = live.wait_for(is_event("step"))
    assert step.scalars["tag"] == 1.0 and module.model is not old_model
    assert abs(step.scalars["w"] - (trained + 4.0)) < 1e-4, "the trained weights came along (one more step on them)"


# --------------------------------------------------------------------------- constants the live state was built from

BUILT_FROM_PY = """\
import torch

N_LAYER = 2
WIDTH = 4


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(WIDTH, WIDTH) for _ in range(N_LAYER)])


def make_model():
    return Stack()


def setup(bench):
    return {"model": make_model()}


def step(state, bench):
    return {"loss": 0.0, "layers": float(len(state["model"].layers)), "width": float(WIDTH)}
"""


def test_a_constant_setup_built_the_state_from_is_named_with_how(start_session) -> None:
    live = start_session({"train.py": BUILT_FROM_PY}, start_paused=True)
    live.wait_for(is_event("setup", status="done"))
    save(live.entry, BUILT_FROM_PY.replace("N_LAYER = 2", "N_LAYER = 3"))
    reload = live.wait_for(is_event("reload", file="train.py"))
    assert reload.ok and reload.changed == ("N_LAYER",) and not reload.held, reload
    said = [n for n in reload.notes if n.startswith("N_LAYER was read when setup() built the live state")]
    assert said and "setup -> make_model -> Stack.__init__" in said[0] and "R (command `rebuild`)" in said[0], reload.notes
    save(live.entry, BUILT_FROM_PY.replace("N_LAYER = 2", "N_LAYER = 3").replace("# nothing", "").replace(
        '"width": float(WIDTH)}', '"width": float(WIDTH) * 2}'))
    quiet = live.wait_for(is_event("reload", file="train.py"))
    assert quiet.changed == ("step",) and not any("was read when" in n for n in quiet.notes), quiet


def test_an_edited_override_that_calls_nothing_runs_again(tmp_path) -> None:
    from conftest import make_project, open_session

    from workbench.protocol.events import StepOnce

    root = make_project(tmp_path, {"train.py": OVERRIDE_PY})
    with open_session(root / "train.py", start_paused=True, argv=["--batch-size", "4"]) as live:
        live.wait_for(is_event("setup", status="done"))
        save(live.entry, OVERRIDE_PY.replace("    batch_size = args.batch_size", "    batch_size = args.batch_size * 2"))
        reload = live.wait_for(is_event("reload", file="train.py"))
        assert reload.ok and reload.changed == ("batch_size",), reload
        assert not any("not re-run" in n for n in reload.notes), reload.notes
        live.send(StepOnce())
        assert live.wait_for(is_event("step")).scalars["batch"] == 8.0
