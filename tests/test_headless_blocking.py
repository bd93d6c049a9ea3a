"""Headless runs that used to block: stdin held open by a driving script, bad bytes on stdin, a stuck step.

Each test runs the real CLI in a subprocess with stdin as an open pipe, as a script
driving vram-bench would. Child processes (DataLoader workers, a step's subprocess)
are watched with psutil: after the run none may be left behind.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import TRAIN_PY, make_project
from workbench.protocol.lines import Line, read_lines

STARTUP_TIMEOUT = 60.0  # torch import + setup on a slow, busy machine

# The real CLI, with the quit escalation's waits lowered from 10 s + 5 s to 1 s + 1 s.
DRIVER = """\
import sys

import workbench.frontends.headless as headless

headless.QUIT_TIMEOUTS = headless.QuitTimeouts(step=1.0, interrupted=1.0, children=2.0)

from workbench.cli import main

sys.exit(main())
"""

LOADER_DATASET = """\
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Sums(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        time.sleep(0.005)  # workers live long enough to be seen
        x = torch.full((4,), float(i % 5))
        return x, x.sum(dim=0, keepdim=True)


def train_on(state, x, y):
    loss = ((state["model"](x) - y) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss
"""

# The case from the issue: a new pair of workers is forked every step, while stdin's reader waits.
LOADER_TRAIN = LOADER_DATASET + """

def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(Sums(), batch_size=16, num_workers=2)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.001), "loader": loader}


def step(state, bench):
    losses = [train_on(state, x, y) for x, y in state["loader"]]
    return {"loss": sum(losses) / len(losses)}
"""

# Persistent workers stay up; the fourth step then blocks in C code, where no interrupt can land.
STUCK_TRAIN = LOADER_DATASET + """

def setup(bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(Sums(), batch_size=8, num_workers=2, persistent_workers=True)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.001), "loader": loader, "batches": iter(())}


def next_batch(state):
    for _ in range(2):
        batch = next(state["batches"], None)
        if batch is not None:
            return batch
        state["batches"] = iter(state["loader"])
    raise RuntimeError("empty loader")


def step(state, bench):
    if bench.step == 3:
        time.sleep(10**6)
    return {"loss": train_on(state, *next_batch(state))}
"""

# The fourth step starts a subprocess of its own, then waits on a lock forever (C code again).
STUCK_WITH_SUBPROCESS = TRAIN_PY.replace("import time\n", "import subprocess\nimport sys\nimport threading\nimport time\n").replace(
    "def step(state, bench):\n",
    "def step(state, bench):\n"
    "    if bench.step == 3:\n"
    "        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "        threading.Event().wait()\n",
)

# The fourth step loops in Python: the interrupt lands, and the quit then goes through.
STUCK_IN_PYTHON = TRAIN_PY.replace(
    "def step(state, bench):\n",
    "def step(state, bench):\n    while bench.step == 3:\n        time.sleep(0.01)\n",
)


class Run:
    """A `run --headless` subprocess whose stdin stays open; stdout parsed as JSON lines as they arrive."""

    def __init__(self, command: list[str], entry: Path, env: dict[str, str]) -> None:
        self.entry = entry
        self.proc = subprocess.Popen(
            [*command, "run", str(entry), "--headless", "--max-steps", "100000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=entry.parent.parent,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self.pos = 0
        self.children: dict[int, psutil.Process] = {}  # every child process seen while it ran
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr: list[bytes] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        threading.Thread(target=self._watch_children, daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: Callable[[Any], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait_event(self, kind: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while self.pos < len(self.events):
                event = self.events[self.pos]
                self.pos += 1
                if event["event"] == kind and all(event.get(k) == v for k, v in fields.items()):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no {kind}{fields or ''} within {timeout} s\n{self.explain()}", pytrace=False)
            try:
                line = self._lines.get(timeout=min(remaining, 0.25))
            except queue.Empty:
                continue
            if line is None:
                self._lines.put(None)
                pytest.fail(f"the process ended before {kind}{fields or ''}\n{self.explain()}", pytrace=False)
            self.events.append(json.loads(line))

    def watch_children(self) -> list[psutil.Process]:
        """The process's children now; all of them are remembered in `children`."""
        now = self._children_now()
        self.children.update((child.pid, child) for child in now)
        return now

    def _watch_children(self) -> None:
        while self.proc.poll() is None:  # DataLoader workers come and go within a step: look often
            self.watch_children()
            time.sleep(0.05)

    def surviving_children(self) -> list[int]:
        return [pid for pid, child in self.children.items() if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        for thread in self._threads:
            thread.join(5)  # a child left behind would hold stdout open: the join would time out
        while (line := self._lines.get_nowait() if not self._lines.empty() else None) is not None:
            self.events.append(json.loads(line))
        return code

    def explain(self) -> str:
        shown = "\n".join(json.dumps(e) for e in self.events[-30:] if e["event"] != "memory")
        return f"--- last events\n{shown}\n--- stderr\n{b''.join(s for s in self._stderr if s)[-3000:].decode(errors='replace')}"

    def close(self) -> None:
        for child in [*self.children.values(), *self._children_now()]:
            try:
                child.kill()  # a hung child of a failed run: it must not outlive the test
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def _children_now(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []


def test_lines_are_split_across_reads_and_bad_ones_are_flagged() -> None:
    read_end, write_end = os.pipe()
    data = b"pause\r\nre" + b"sume\n" + b"x" * 25 + b"\nstep\n\xffquit\nquit"
    os.write(write_end, data)
    os.close(write_end)
    lines = list(read_lines(read_end, max_bytes=20, chunk=4))  # 4-byte reads: every line spans several
    os.close(read_end)
    assert [line.text for line in lines[:3]] == ["pause", "resume", ""]
    assert lines[2].problem == "a command line longer than 20 bytes was skipped"
    assert lines[3] == Line("step")
    assert lines[4].text == "\ufffdquit" and "not valid UTF-8 (byte 0" in (lines[4].problem or "")
    assert lines[5:] == [Line("quit")]  # the last line needs no newline


@pytest.fixture
def headless_run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Factory: `headless_run(train_source, driver=False, **env)` -> a running `Run`, stdin open."""
    started: list[Run] = []

    def start(train: str, *, driver: bool = False, **env: str) -> Run:
        root = make_project(tmp_path, {"train.py": train}, folder=f"proj{len(started)}")
        command = [sys.executable, "-m", "workbench"]
        if driver:
            script = tmp_path / "driver.py"
            script.write_text(DRIVER, encoding="utf-8")
            command = [sys.executable, str(script)]
        run = Run(command, root / "train.py", {**os.environ, **env})
        started.append(run)
        return run

    yield start
    for run in started:
        run.close()


def test_dataloader_workers_run_with_stdin_open_and_quit_leaves_none(headless_run) -> None:
    run = headless_run(LOADER_TRAIN)
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    for _ in range(3):
        run.wait_event("step", 20)  # before the fix: none, the forked workers hung on stdin's lock
        run.watch_children()
    assert run.children, "the DataLoader never started a worker process"

    run.send(b"quit\n")
    exit_event = run.wait_event("exit", 20)
    assert (exit_event["reason"], exit_event["code"]) == ("quit", 0)
    assert run.finish(20) == 0, run.explain()
    assert run.surviving_children() == []


def test_bad_bytes_and_an_overlong_line_on_stdin_get_errors_and_commands_still_work(headless_run) -> None:
    run = headless_run(TRAIN_PY, PYTHONIOENCODING="utf-8:strict")
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step")

    run.send(b"\xff\xfe garbage\n")
    error = run.wait_event("error", where="command")
    assert "not valid UTF-8" in error["message"], error
    run.send(b"pause\n")
    run.wait_event("paused", reason="user")

    run.send(b"x" * (3 << 19) + b"resume\n")  # 1.5 MiB on one line: reported once, skipped, not run
    error = run.wait_event("error", where="command")
    assert "longer than 1,048,576 bytes" in error["message"], error
    run.send(b"resume\n")
    resumed = run.wait_event("resumed", reason="user")
    assert not any(e["event"] == "resumed" for e in run.events[: run.events.index(resumed)])
    assert sum(e["event"] == "error" and e.get("where") == "command" for e in run.events) == 2

    run.send(b"quit\n")
    assert run.wait_event("exit")["code"] == 0
    assert run.finish(20) == 0, run.explain()


def test_quit_ends_a_step_stuck_in_c_code_and_its_dataloader_workers(headless_run) -> None:
    run = headless_run(STUCK_TRAIN, driver=True)
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step", 20, step=3)
    time.sleep(0.3)  # into the stuck step
    assert len(run.watch_children()) == 2, run.explain()

    asked = time.monotonic()
    run.send(b"quit\n")
    interrupted = run.wait_event("error", 10, where="quit")
    assert "its step was interrupted" in interrupted["message"], interrupted
    forced = run.wait_event("error", 10, where="quit")
    assert "ending 2 child process(es)" in forced["message"], forced
    exit_event = run.wait_event("exit", 10)
    assert (exit_event["reason"], exit_event["step"], exit_event["code"]) == ("stuck", 3, 1)
    assert run.finish(10) == 1, run.explain()
    assert time.monotonic() - asked < 10  # 1 s + 1 s of grace, then up to 2 s for the workers
    assert run.surviving_children() == []


def test_sigterm_ends_a_step_stuck_on_a_lock_and_the_subprocess_it_started(headless_run) -> None:
    run = headless_run(STUCK_WITH_SUBPROCESS, driver=True)
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step", 20, step=3)
    deadline = time.monotonic() + 10
    while not run.watch_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(run.children) == 1, run.explain()

    run.proc.send_signal(signal.SIGTERM)
    stopping = run.wait_event("error", 10, where="stopping")  # a warning (the step runs on), not an error
    assert "signal again to interrupt it" in stopping["message"], stopping
    exit_event = run.wait_event("exit", 15)
    assert (exit_event["reason"], exit_event["code"]) == ("stuck", 1)
    assert run.finish(10) == 1, run.explain()
    assert run.surviving_children() == []


def test_quit_interrupts_a_step_looping_in_python_then_quits_cleanly(headless_run) -> None:
    run = headless_run(STUCK_IN_PYTHON, driver=True)
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step", 20, step=3)
    time.sleep(0.3)  # into the looping step

    run.send(b"quit\n")
    run.wait_event("error", 10, where="quit")
    stopped = run.wait_event("error", 10, where="step")
    assert "interrupted" in stopped["message"], stopped
    exit_event = run.wait_event("exit", 10)
    assert (exit_event["reason"], exit_event["code"]) == ("quit", 0)
    assert run.finish(20) == 0, run.explain()
    assert not any(e["event"] == "error" and "exiting with code" in e["message"] for e in run.events)


PRINTING_WORKERS = LOADER_TRAIN.replace(
    "        time.sleep(0.005)  # workers live long enough to be seen\n",
    "        time.sleep(0.005)  # workers live long enough to be seen\n"
    "        if i == 0:\n"
    "            print(f'worker says hello from pid {__import__(\"os\").getpid()}', flush=True)\n",
)


def test_a_dataloader_workers_print_reaches_stderr_not_a_lost_event_or_the_protocol(headless_run) -> None:
    """A forked worker inherits the training thread's routed stdout: its prints went into an event bus
    nobody reads in that process (lost), behind locks another thread may hold at the fork (a hang)."""
    run = headless_run(PRINTING_WORKERS)
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step", 20, step=2)
    run.send(b"quit\n")
    run.wait_event("exit", 20)
    assert run.finish(20) == 0, run.explain()
    stderr = b"".join(s for s in run._stderr if s).decode(errors="replace")
    assert stderr.count("worker says hello from pid") >= 2, run.explain()
    assert all(isinstance(e, dict) and "event" in e for e in run.events)  # stdout stayed protocol only


def test_a_quit_during_a_long_rebuild_waits_for_it_instead_of_forcing_an_exit(headless_run) -> None:
    """A rebuild carries the trained state over: a quit that force-exited in the middle would lose it."""
    run = headless_run(TRAIN_PY, driver=True)  # quit escalation lowered to 1 s + 1 s
    run.wait_event("setup", STARTUP_TIMEOUT, status="done")
    run.wait_event("step")
    slow = TRAIN_PY.replace("def setup(bench):\n", "def setup(bench):\n    time.sleep(4)\n")
    assert slow != TRAIN_PY and "import time" in TRAIN_PY
    run.entry.write_text(slow, encoding="utf-8")
    run.wait_event("reload", 20, file="train.py")
    run.send(b"rebuild\n")
    time.sleep(1.0)  # into the rebuild's setup()
    run.send(b"quit\n")
    rebuilt = run.wait_event("rebuild", 20)
    assert rebuilt["ok"], rebuilt
    exit_event = run.wait_event("exit", 20)
    assert (exit_event["reason"], exit_event["code"]) == ("quit", 0), run.explain()
    assert not any(e["event"] == "error" and e.get("where") == "quit" for e in run.events), run.explain()
    assert run.finish(20) == 0
