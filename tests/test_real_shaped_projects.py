"""Issue 13, "Must have 3": projects shaped like real trainers, driven through edits, rebuilds and rollbacks.

The projects are plain folders under tests/real_projects/ that `vram-bench run` could open: a
nanoGPT-style script with its config in module globals and an argparse parser, a GPT in its own
model.py with a dataclass config, a classifier fed by a DataLoader with persistent worker
processes, and a GAN with two optimizers made in two places. Each test copies one to a tmp dir,
starts a real session, saves a scripted series of edits, and after each one checks what the
reload or rebuild event says AND what the next step computes (every step returns scalars that
depend on the edited code). Each ends with the right code running and one model alive.

Events on the bus are in the order the training thread made them: a step after a reload or
rebuild event ran with what that event applied.
"""

from __future__ import annotations

import contextlib
import gc
import json
import queue
import shutil
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from conftest import Live, is_event, open_session, save
from workbench.protocol.events import Event, Rebuild, Rollback, StepOnce
from workbench.engine.project import load_project
from workbench.engine.session import Session, SessionConfig

PROJECTS = Path(__file__).resolve().parent / "real_projects"
STARTUP_TIMEOUT = 60.0  # a subprocess importing torch on a busy 2-core machine


# --------------------------------------------------------------------------- helpers


def copy_project(name: str, tmp_path: Path) -> Path:
    """A project from tests/real_projects copied to tmp_path: edits and .vram-bench/ stay out of the checkout."""
    target = tmp_path / name
    shutil.copytree(PROJECTS / name, target, ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    return target


@contextlib.contextmanager
def running(root: Path, *argv: str, **config: Any) -> Iterator[Live]:
    """conftest.open_session for a project folder, with the script's own arguments (`-- ARGS`)."""
    with open_session(root / "train.py", argv, **config) as live:
        yield live


def edit(path: Path, *replacements: tuple[str, str]) -> None:
    """Save `path` with each (old, new) replaced; each `old` must be in the file exactly once."""
    text = path.read_text(encoding="utf-8")
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} is in {path.name} {text.count(old)} times"
        text = text.replace(old, new)
    save(path, text)


def step_once(live: Live) -> Event:
    """Run one step of a paused session; its event."""
    live.send(StepOnce())
    return live.wait_for(is_event("step"))


def next_steps(live: Live, n: int = 1) -> list[Event]:
    """The next `n` steps of a running session (they ran after every event seen so far)."""
    return live.events.steps(n, timeout=15)


def reload_of(live: Live, file: str) -> Event:
    return live.wait_for(is_event("reload", file=file), timeout=15)


def rebuild(live: Live) -> Event:
    live.send(Rebuild())
    rebuilt = live.wait_for(is_event("rebuild"), timeout=30)
    assert rebuilt.ok, rebuilt
    return rebuilt


def rollback(live: Live, file: str) -> Event:
    live.send(Rollback())
    rolled = reload_of(live, file)
    assert rolled.ok and any(note.startswith("rolled back version") for note in rolled.notes), rolled
    return rolled


def alive(refs: list[weakref.ref]) -> list[int]:
    """Indexes of the objects in `refs` that are still alive after a full collection."""
    gc.collect()
    return [n for n, ref in enumerate(refs) if ref() is not None]


def instances(cls: type) -> int:
    """Instances of `cls` anywhere in the process (after the session ends: frozen objects are not listed)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is cls)


def said(event: Event, *words: str) -> bool:
    """Whether one of the event's notes or rebuild reasons has all of `words`."""
    lines = (*event.notes, *getattr(event, "needs_rebuild", ()))
    return any(all(word in line for word in words) for line in lines)


# --------------------------------------------------------------------------- 1. a nanoGPT-style script


def expected_lr(learning_rate: float, it: int) -> float:
    """script_trainer's get_lr during warmup (iterations 0-19), computed here, not by the project."""
    assert it < 20, "the test steps stay in warmup"
    return learning_rate * (it + 1) / 21


def test_script_trainer_runs_with_its_arguments_through_edits_a_rebuild_and_rollbacks(tmp_path, one_torch_thread) -> None:
    root = copy_project("script_trainer", tmp_path)
    with running(root, "--batch-size", "4", start_paused=True) as live:
        module = live.session.project.module
        live.wait_for(is_event("setup", status="done"), timeout=30)
        assert module.argv_seen == [str(live.entry), "--batch-size", "4"], "sys.argv as `python train.py --batch-size 4`"
        first = step_once(live)
        assert first.scalars["batch"] == 4.0 and first.scalars["block"] == 16.0, "the argument took effect"
        assert first.scalars["lr"] == pytest.approx(expected_lr(1e-3, 0)) and first.scalars["beta2"] == 0.999
        models = [weakref.ref(live.session.worker.user_state["model"])]
        assert module.model is live.session.worker.user_state["model"], "setup's `global model` is the state's model"

        # A shorter context in get_batch(), a function that reads module globals: patched in place.
        edit(live.entry, ("data[i : i + block_size]", "data[i : i + block_size // 2]"),
             ("data[i + 1 : i + 1 + block_size]", "data[i + 1 : i + 1 + block_size // 2]"))
        reload = reload_of(live, "train.py")
        assert reload.ok and reload.changed == ("get_batch",) and not reload.held, reload
        shorter = step_once(live)
        assert (shorter.scalars["block"], shorter.scalars["batch"]) == (8.0, 4.0), "new get_batch, same --batch-size"

        # A config constant: re-bound; get_lr() reads it on the next step.
        edit(live.entry, ("learning_rate = 1e-3", "learning_rate = 2e-3"))
        reload = reload_of(live, "train.py")
        assert reload.ok and reload.changed == ("learning_rate",), reload
        faster = step_once(live)
        assert faster.scalars["lr"] == pytest.approx(expected_lr(2e-3, faster.step - 1))

        # setup() builds the optimizer: held for a rebuild, which re-binds the module globals.
        edit(live.entry, ("weight_decay=weight_decay)", "weight_decay=weight_decay, betas=(0.9, 0.95))"))
        held = reload_of(live, "train.py")
        assert held.held == ("setup",) and held.needs_rebuild, held
        assert live.session.status().needs_rebuild == ("train.py",)
        assert step_once(live).scalars["beta2"] == 0.999, "held back: the old optimizer still steps"
        rebuilt = rebuild(live)
        assert rebuilt.changed == ("setup",) and rebuilt.tensors_carried == 5, rebuilt
        assert not (rebuilt.new or rebuilt.mismatched or rebuilt.dropped), rebuilt
        after = step_once(live)
        assert after.scalars["beta2"] == 0.95 and after.scalars["block"] == 8.0 and after.scalars["batch"] == 4.0
        state = live.session.worker.user_state
        assert module.model is state["model"] and module.optimizer is state["optimizer"], "step() reads the new globals"
        models.append(weakref.ref(state["model"]))
        del state
        assert alive(models) == [1], "the model setup() made first is released by the rebuild"

        # Undo the three versions, newest first.
        rolled = rollback(live, "train.py")
        assert rolled.changed == ("setup",) and said(rolled, "setup"), rolled  # the live optimizer came from it
        rolled = rollback(live, "train.py")
        assert rolled.changed == ("learning_rate",), rolled
        back = step_once(live)
        assert back.scalars["lr"] == pytest.approx(expected_lr(1e-3, back.step - 1)) and back.scalars["block"] == 8.0
        rolled = rollback(live, "train.py")
        assert rolled.changed == ("get_batch",), rolled
        assert step_once(live).scalars["block"] == 16.0

        # A rebuild on the code of version 0: its setup() builds the state again.
        rebuild(live)
        end = step_once(live)
        assert (end.scalars["batch"], end.scalars["block"], end.scalars["beta2"]) == (4.0, 16.0, 0.999)
        assert end.scalars["lr"] == pytest.approx(expected_lr(1e-3, end.step - 1))
        models.append(weakref.ref(live.session.worker.user_state["model"]))
        assert alive(models) == [2], f"models alive (0 is setup's, then one per rebuild): {alive(models)}"
        assert module.model is live.session.worker.user_state["model"]
        model_class = type(module.model)
    assert instances(model_class) == 1, "one BigramLM in the whole process"


def test_editing_a_default_the_command_line_overrides_keeps_the_override_or_says_so(tmp_path, one_torch_thread) -> None:
    root = copy_project("script_trainer", tmp_path)
    with running(root, "--batch-size", "4", start_paused=True) as live:
        live.wait_for(is_event("setup", status="done"), timeout=30)
        assert step_once(live).scalars["batch"] == 4.0
        edit(live.entry, ("batch_size = 8", "batch_size = 12"))
        reload = reload_of(live, "train.py")
        assert reload.ok, reload
        batch = step_once(live).scalars["batch"]
        assert batch == 4.0 or said(reload, "batch_size", "args.batch_size"), (batch, reload)


@pytest.mark.timeout(90)
def test_script_trainer_from_the_command_line_gets_its_arguments(tmp_path) -> None:
    root = copy_project("script_trainer", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "run", str(root / "train.py"), "--headless", "--max-steps", "2",
         "--", "--batch-size", "4"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=80, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert "Overriding: batch_size = 4" in [e["text"] for e in events if e["event"] == "print"]
    steps = [e for e in events if e["event"] == "step"]
    assert [e["scalars"]["batch"] for e in steps] == [4.0, 4.0]
    assert events[-1]["event"] == "exit" and events[-1]["reason"] == "max steps"


# --------------------------------------------------------------------------- 2. a GPT in model.py with a dataclass config


def block_sums(block: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """What the first block gives on the probe: (sequential residuals as written first, parallel ones as edited)."""
    with torch.no_grad():
        sequential = x + block.attn(block.ln_1(x))
        sequential = sequential + block.mlp(block.ln_2(sequential))
        parallel = x + block.attn(block.ln_1(x)) + block.mlp(block.ln_2(x))
    return float(sequential.sum()), float(parallel.sum())


def probe_ran(live: Live, step: Event) -> str:
    """Which Block.forward the step ran: 'sequential' or 'parallel' (the session is paused: weights are still).

    The test runs the same tensor operations in the same order on the same weights, so the sums match
    to the last bits; the two forms differ by far more."""
    model = live.session.worker.user_state["model"]
    sequential, parallel = block_sums(model.transformer.h[0], live.session.project.module.PROBE)
    assert abs(sequential - parallel) > 1e-5, "the probe tells the two apart"
    got = step.scalars["probe"]
    if got == pytest.approx(sequential, rel=0, abs=1e-6):
        return "sequential"
    if got == pytest.approx(parallel, rel=0, abs=1e-6):
        return "parallel"
    raise AssertionError(f"probe {got} is neither {sequential} (sequential) nor {parallel} (parallel)")


BLOCK_FORWARD = (
    "        x = x + self.attn(self.ln_1(x))\n        x = x + self.mlp(self.ln_2(x))\n        return x\n",
    "        return x + self.attn(self.ln_1(x)) + self.mlp(self.ln_2(x))  # parallel residual, as in GPT-J\n",
)
N_LAYER = ("n_layer: int = 2", "n_layer: int = 3")


def test_two_file_model_through_a_forward_edit_a_config_rebuild_and_rollbacks(tmp_path, one_torch_thread) -> None:
    root = copy_project("two_file_model", tmp_path)
    with running(root, start_paused=True) as live:
        live.wait_for(is_event("setup", status="done"), timeout=30)
        first = step_once(live)
        assert probe_ran(live, first) == "sequential" and first.scalars["n_layer"] == 2.0
        model = live.session.worker.user_state["model"]
        models = [weakref.ref(model)]
        old_tensors, old_params = len(model.state_dict()), len(list(model.parameters()))  # lm_head and wte are tied
        del model

        # Block.forward: patched on the live class; the live model's blocks run it at once.
        edit(root / "model.py", BLOCK_FORWARD)
        reload = reload_of(live, "model.py")
        assert reload.ok and reload.changed == ("Block.forward",) and not reload.held, reload
        assert probe_ran(live, step_once(live)) == "parallel"

        # A GPTConfig default: the model keeps a GPTConfig as self.config, so it is held for a rebuild.
        edit(root / "model.py", N_LAYER)
        held = reload_of(live, "model.py")
        assert held.held == ("GPTConfig",) and said(held, "GPTConfig", "model.config"), held
        assert live.session.status().needs_rebuild == ("model.py",)
        assert step_once(live).scalars["n_layer"] == 2.0, "held: the old model trains on"
        rebuilt = rebuild(live)
        assert rebuilt.changed == ("GPTConfig",) and rebuilt.tensors_carried == old_tensors, rebuilt
        assert rebuilt.optimizer_states_carried == old_params and not rebuilt.dropped, rebuilt
        assert len(rebuilt.new) == 12 and all(name.startswith("model.transformer.h.2.") for name in rebuilt.new), rebuilt
        state = live.session.worker.user_state
        models.append(weakref.ref(state["model"]))
        before = [p.detach().clone() for p in state["model"].parameters()]
        deeper = step_once(live)
        assert deeper.scalars["n_layer"] == 3.0 and probe_ran(live, deeper) == "parallel"
        optimized = {id(p) for group in state["optimizer"].param_groups for p in group["params"]}
        assert optimized == {id(p) for p in state["model"].parameters()}, "the new optimizer holds the new model's parameters"
        assert all(not torch.equal(b, p) for b, p in zip(before, state["model"].parameters())), "the step trained the new model"
        del state, before
        assert alive(models) == [1]

        # Roll back the config version: the state keeps its 3 layers until a rebuild, and the event says so.
        rolled = rollback(live, "model.py")
        assert rolled.changed == ("GPTConfig",) and said(rolled, "GPTConfig", "model.config"), rolled
        assert step_once(live).scalars["n_layer"] == 3.0
        rebuilt = rebuild(live)
        assert len(rebuilt.dropped) == 12 and all(name.startswith("model.transformer.h.2.") for name in rebuilt.dropped)
        assert not rebuilt.new, rebuilt
        models.append(weakref.ref(live.session.worker.user_state["model"]))
        back = step_once(live)
        assert back.scalars["n_layer"] == 2.0 and probe_ran(live, back) == "parallel"

        # Roll back Block.forward: the code of version 0 runs on the rebuilt model.
        rolled = rollback(live, "model.py")
        assert rolled.changed == ("Block.forward",) and not rolled.needs_rebuild, rolled
        end = step_once(live)
        assert probe_ran(live, end) == "sequential" and end.scalars["n_layer"] == 2.0
        assert alive(models) == [2], f"models alive (0 is setup's, then one per rebuild): {alive(models)}"
        model_class = type(live.session.worker.user_state["model"])
    assert instances(model_class) == 1, "one GPT in the whole process"


async def test_two_file_model_in_the_app_logs_a_reload_and_a_rebuild(tmp_path, one_torch_thread) -> None:
    from tests.test_tui import log_text, until
    from workbench.frontends.tui.app import make_app

    root = copy_project("two_file_model", tmp_path)
    config = SessionConfig(device=torch.device("cpu"), exit_at_max_steps=False)
    session = Session(load_project(root / "train.py"), config)
    app = make_app(session, timestamps=False)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: session.status().step > 2, what="training")
            assert session.wait_until_watching()
            edit(root / "model.py", BLOCK_FORWARD)
            await until(pilot, lambda: "RELOAD model.py -> code v1: Block.forward" in log_text(app), what="the reload line")
            edit(root / "model.py", N_LAYER)
            await until(pilot, lambda: "NEEDS REBUILD model.py: held back GPTConfig" in log_text(app), what="the held line")
            await pilot.press("R")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="the rebuild question")
            await pilot.press("y")
            await until(pilot, lambda: "REBUILT" in log_text(app), what="the rebuild line")
            assert "new: model.transformer.h.2." in "".join(log_text(app).split("\n"))  # lines wrap at the pane width
            await until(pilot, lambda: session.worker.step > 0 and session.worker.user_state["model"].config.n_layer == 3,
                        what="the rebuilt model")
    finally:
        session.close()


# --------------------------------------------------------------------------- 3. a DataLoader with persistent workers


def worker_pids(others: set[int] = frozenset()) -> set[int]:
    """This process's children but `others`: the DataLoader worker processes of the session it runs."""
    return {child.pid for child in psutil.Process().children(recursive=True)} - others


def wait_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    """The pids of `pids` still running after up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
        if not left:
            return set()
        time.sleep(0.1)
    return left


@pytest.fixture
def loader_sessions() -> Iterator[list[Live]]:
    """Sessions of loader_workers: at teardown (they have ended) their loaders are dropped here, so the
    persistent worker processes exit now, not in whichever thread collects the session later (the next
    test's setup(), say, which would wait for them)."""
    lives: list[Live] = []
    workers = worker_pids()
    yield lives
    workers = worker_pids() - workers
    for live in lives:
        state = live.session.worker.user_state
        if isinstance(state, dict):
            state.pop("batches", None)
            state.pop("loader", None)  # a persistent loader keeps its iterator (and workers) too
    gc.collect()
    assert not wait_gone(workers), "the worker processes outlived their loader"


DATASET_EDIT = ("version = 1.0", "version = 2.0")


def test_loader_workers_keep_the_code_they_were_forked_with_and_a_rebuild_starts_new_ones(
    tmp_path, one_torch_thread, loader_sessions
) -> None:
    root = copy_project("loader_workers", tmp_path)
    others = worker_pids()
    with running(root) as live:
        loader_sessions.append(live)
        live.wait_running(2)
        state = live.session.worker.user_state
        models = [weakref.ref(state["model"])]
        first_workers = worker_pids(others)
        assert len(first_workers) == 2, first_workers
        assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 2))

        # The Dataset's __getitem__: patched in this process, but the persistent workers run their copy.
        edit(root / "data.py", DATASET_EDIT)
        reload = reload_of(live, "data.py")
        assert reload.ok and reload.changed == ("ShapesDataset.__getitem__",), reload
        assert said(reload, "state['loader']", "ShapesDataset.__getitem__", "2 worker processes", "R (command `rebuild`)"), (
            reload.notes
        )
        later = next_steps(live, 6)  # 4 batches an epoch: 6 steps in a row cross into the next one
        assert later[-1].scalars["epoch"] > later[0].scalars["epoch"], "an epoch ended: the iterator was made again"
        assert all(step.scalars["data_version"] == 1.0 for step in later), "persistent workers keep the old code, as said"
        assert worker_pids(others) == first_workers
        del state

        # R: setup() again makes a new loader; its workers are forked with the new code, the old ones exit.
        rebuild(live)
        assert all(step.scalars["data_version"] == 2.0 for step in next_steps(live, 3))
        assert not wait_gone(first_workers), "the old loader's workers exit with the old state"
        second_workers = worker_pids(others)
        assert len(second_workers) == 2 and not second_workers & first_workers, second_workers
        models.append(weakref.ref(live.session.worker.user_state["model"]))

        # Roll back: this process has the old __getitem__ again; the workers forked after the save keep the new one.
        rolled = rollback(live, "data.py")
        assert rolled.changed == ("ShapesDataset.__getitem__",), rolled
        assert all(step.scalars["data_version"] == 2.0 for step in next_steps(live, 2))
        rebuild(live)
        assert all(step.scalars["data_version"] == 1.0 for step in next_steps(live, 3)), "the code of version 0 runs"
        assert not wait_gone(second_workers)
        assert len(worker_pids(others) - first_workers - second_workers) == 2
        models.append(weakref.ref(live.session.worker.user_state["model"]))
        assert alive(models) == [2], f"models alive (0 is setup's, then one per rebuild): {alive(models)}"
        model_class = type(live.session.worker.user_state["model"])
    assert instances(model_class) == 1, "one SmallCNN in the whole process"


def test_rolling_back_a_dataset_edit_says_the_loader_workers_keep_the_newer_code(
    tmp_path, one_torch_thread, loader_sessions
) -> None:
    root = copy_project("loader_workers", tmp_path)
    with running(root) as live:
        loader_sessions.append(live)
        live.wait_running(1)
        edit(root / "data.py", DATASET_EDIT)
        reload_of(live, "data.py")
        rebuild(live)
        assert next_steps(live, 1)[0].scalars["data_version"] == 2.0
        rolled = rollback(live, "data.py")
        assert next_steps(live, 1)[0].scalars["data_version"] == 2.0
        assert said(rolled, "ShapesDataset.__getitem__", "worker processes"), rolled.notes


class HeadlessRun:
    """`vram-bench run train.py --headless` with stdin held open; stdout events read on a thread."""

    def __init__(self, entry: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workbench", "run", str(entry), "--headless"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=entry.parent.parent,
        )
        self.events: list[dict[str, Any]] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        for stream, sink in ((self.proc.stdout, self._lines.put), (self.proc.stderr, self._stderr.append)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line)
        sink(None)

    def wait_for(self, kind: str, timeout: float, count: int = 1) -> list[dict[str, Any]]:
        """The first `count` events named `kind`; fails after `timeout` s saying what came."""
        deadline = time.monotonic() + timeout
        while len(found := [e for e in self.events if e["event"] == kind]) < count:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                line = ""
            if line is None or (not line and remaining <= 0):
                seen = [e["event"] for e in self.events if e["event"] != "memory"]
                pytest.fail(f"{count} {kind} event(s) did not come within {timeout} s; events: {seen}; stderr: "
                            f"{''.join(s for s in self._stderr if s)[-2000:]}", pytrace=False)
            if line:
                self.events.append(json.loads(line))
        return found[:count]

    def close(self) -> None:
        """Kill what is left (a hung run and the workers it forked), then close the pipes."""
        if self.proc.poll() is None:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()


@pytest.mark.timeout(90)
def test_loader_workers_headless_with_stdin_open_steps_and_quits_with_its_workers_gone(tmp_path) -> None:
    """Stdin held open, as a driving script does: the reader thread is blocked reading it while the DataLoader
    forks its workers (it used to hang there, before the first step), and only `quit` ends the run."""
    root = copy_project("loader_workers", tmp_path)
    run = HeadlessRun(root / "train.py")
    try:
        run.wait_for("setup", STARTUP_TIMEOUT, count=2)  # running, then done
        run.wait_for("step", 20.0, count=3)
        workers = {child.pid for child in psutil.Process(run.proc.pid).children(recursive=True)}
        assert len(workers) == 2, workers
        run.proc.stdin.write("quit\n")  # stdin stays open: only the command ends the run
        run.proc.stdin.flush()
        exit_event = run.wait_for("exit", 30.0)[0]
        assert exit_event["reason"] == "quit" and exit_event["code"] == 0, exit_event
        assert run.proc.wait(30) == 0
        assert not wait_gone(workers), "the DataLoader's worker processes outlived the run"
    finally:
        run.close()


# --------------------------------------------------------------------------- 4. two optimizers made in two places


def adam_steps(optimizer: torch.optim.Optimizer) -> set[float]:
    return {float(s["step"]) for s in optimizer.state.values()}


def params_of(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


SLOPE = ("nn.LeakyReLU(0.2)", "nn.LeakyReLU(0.1)")


def test_two_optimizers_through_a_rebuild_and_a_rollback(tmp_path, one_torch_thread) -> None:
    root = copy_project("two_optimizers", tmp_path)
    with running(root, start_paused=True) as live:
        live.wait_for(is_event("setup", status="done"), timeout=30)
        for _ in range(3):
            assert step_once(live).scalars["slope"] == 0.2
        state = live.session.worker.user_state
        assert adam_steps(state["opt_g"]) == adam_steps(state["opt_d"]) == {3.0}
        generators, discriminators = [weakref.ref(state["G"])], [weakref.ref(state["D"])]
        old_params = [weakref.ref(p) for p in (*state["G"].parameters(), *state["D"].parameters())]
        del state

        # Discriminator.__init__ changed: held for a rebuild, naming the live D.
        edit(live.entry, SLOPE)
        held = reload_of(live, "train.py")
        assert held.held == ("Discriminator.__init__",) and said(held, "Discriminator.__init__", "D"), held
        assert step_once(live).scalars["slope"] == 0.2, "held: the old D trains on"
        rebuilt = rebuild(live)
        assert rebuilt.changed == ("Discriminator.__init__",) and rebuilt.tensors_carried == 8, rebuilt
        assert rebuilt.optimizer_states_carried == 4 and not (rebuilt.new or rebuilt.mismatched or rebuilt.dropped), rebuilt
        # setup() makes opt_g: carried like any. step() made opt_d: made again over the new D, and said.
        assert said(rebuilt, "state['opt_d']", "made again over the new parameters"), rebuilt

        state = live.session.worker.user_state
        G, D = state["G"], state["D"]
        before = [p.detach().clone() for p in (*G.parameters(), *D.parameters())]
        after = step_once(live)
        assert after.scalars["slope"] == 0.1
        assert params_of(state["opt_g"]) == {id(p) for p in G.parameters()}, "opt_g steps the new G"
        assert params_of(state["opt_d"]) == {id(p) for p in D.parameters()}, "opt_d steps the new D"
        assert adam_steps(state["opt_g"]) == adam_steps(state["opt_d"]) == {5.0}, "both Adam states carried (4 + 1 steps)"
        assert all(not torch.equal(b, p) for b, p in zip(before, (*G.parameters(), *D.parameters()))), (
            "the step trained every parameter of the new models"
        )
        generators.append(weakref.ref(G))
        discriminators.append(weakref.ref(D))
        del state, G, D, before
        assert alive(generators) == alive(discriminators) == [1]
        assert alive(old_params) == [], "nothing keeps the old models' parameters (an old optimizer would)"

        # Roll back: the live D was built by the rolled-back __init__, and the event says so; R builds it again.
        rolled = rollback(live, "train.py")
        assert rolled.changed == ("Discriminator.__init__",) and said(rolled, "Discriminator.__init__", "D"), rolled
        assert step_once(live).scalars["slope"] == 0.1
        rebuild(live)
        assert step_once(live).scalars["slope"] == 0.2
        state = live.session.worker.user_state
        generators.append(weakref.ref(state["G"]))
        discriminators.append(weakref.ref(state["D"]))
        assert params_of(state["opt_g"]) == {id(p) for p in state["G"].parameters()}
        assert params_of(state["opt_d"]) == {id(p) for p in state["D"].parameters()}
        assert adam_steps(state["opt_g"]) == adam_steps(state["opt_d"]) == {7.0}
        classes = type(state["G"]), type(state["D"])
        del state
        assert alive(generators) == alive(discriminators) == [2], (alive(generators), alive(discriminators))
    assert [instances(cls) for cls in classes] == [1, 1], "one Generator and one Discriminator in the whole process"


GLOBAL_OPT_D = (
    ("lr_d = 1e-3\n", "lr_d = 1e-3\nopt_d = None  # made by the first step\n"),
    ('    if "opt_d" not in state:\n        state["opt_d"] = torch.optim.Adam(',
     "    global opt_d\n    if opt_d is None:\n        opt_d = torch.optim.Adam("),
    ('    opt_d = state["opt_d"]\n', ""),
)


def test_a_rebuild_moves_an_optimizer_step_keeps_in_a_module_global_to_the_new_model(tmp_path, one_torch_thread) -> None:
    """The same GAN with opt_d in a module global (`global opt_d`), as scripts keep it. Left alone after a
    rebuild it would go on stepping the discarded D, keeping its parameters alive, while the new D never learns."""
    root = copy_project("two_optimizers", tmp_path)
    edit(root / "train.py", *GLOBAL_OPT_D)
    with running(root, start_paused=True) as live:
        live.wait_for(is_event("setup", status="done"), timeout=30)
        for _ in range(3):
            step_once(live)
        module = live.session.project.module
        assert "opt_d" not in live.session.worker.user_state and adam_steps(module.opt_d) == {3.0}
        old_d_params = [weakref.ref(p) for p in live.session.worker.user_state["D"].parameters()]
        edit(live.entry, SLOPE)
        reload_of(live, "train.py")
        rebuilt = rebuild(live)
        assert said(rebuilt, "train.opt_d", "made again over the new parameters"), rebuilt
        D = live.session.worker.user_state["D"]
        before = [p.detach().clone() for p in D.parameters()]
        assert step_once(live).scalars["slope"] == 0.1
        assert params_of(module.opt_d) == {id(p) for p in D.parameters()}, "the global opt_d steps the new D"
        assert adam_steps(module.opt_d) == {4.0}, "with its Adam state"
        assert all(not torch.equal(b, p) for b, p in zip(before, D.parameters())), "the new D trained"
        del D, before
        assert alive(old_d_params) == [], "nothing keeps the old D's parameters"
